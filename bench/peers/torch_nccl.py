#!/usr/bin/env python3
"""Peer for `gpulab bench nccl`: torch.distributed all-reduce (NCCL backend, fp32 sum) over every
visible GPU, busbw as nccl-tests counts it (2(n-1)/n x algbw), #wrong from integer inputs.
Prints a JSON array in gpulab's result schema (suite "nccl_peer_torch").

    torchrun --nproc_per_node=$(nvidia-smi -L | wc -l) bench/peers/torch_nccl.py > torch_nccl.json
"""
import datetime
import json
import os
import statistics

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink SHARP multicast on these machines

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    sizes = [1 << s for s in range(13, 34, 3)]  # 8 KiB .. 8 GiB
    free = torch.cuda.mem_get_info()[0]
    sizes = [s for s in sizes if 2 * s < free // 4]
    factor = 2 * (world - 1) / world
    results = []
    for size in sizes:
        count = size // 4
        idx = torch.arange(count, device="cuda", dtype=torch.int64)
        x = ((rank * 7 + idx) % 5 - 2).float()
        expect = sum(((r * 7 + idx) % 5 - 2).float() for r in range(world))
        y = x.clone()
        dist.all_reduce(y)
        wrong = torch.tensor([int((y != expect).sum())], device="cuda")
        dist.all_reduce(wrong)
        iters = max(1, min(200, (256 << 20) // size))
        for _ in range(5):
            dist.all_reduce(y)
        times = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                dist.all_reduce(y)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / iters)
        algbw = [size / (t * 1e-3) / 1e9 for t in times]
        busbw = [a * factor for a in algbw]
        if rank == 0:
            value = statistics.median(busbw if world > 1 else algbw)
            results.append({
                "schema": 1, "suite": "nccl_peer_torch", "name": f"all_reduce_{size}B",
                "metric": "busbw" if world > 1 else "algbw", "value": value, "unit": "GB/s", "peak": None, "fraction": None,
                "params": {"bytes": size, "ranks": world, "busbw_factor": factor, "wrong": int(wrong.item()),
                           "algbw_gbps": statistics.median(algbw), "time_us": statistics.median(times) * 1e3,
                           "torch": torch.__version__, "samples": len(times)},
                "gpu": {"name": torch.cuda.get_device_name(), "sm_clock": None, "mem_clock": None, "driver": ""},
                "git": "unknown", "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")})
    if rank == 0:
        print(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
