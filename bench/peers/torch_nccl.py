#!/usr/bin/env python3
"""Peer for `gpulab bench nccl`: torch.distributed all-reduce (NCCL backend, fp32 sum) over every
visible GPU, busbw as nccl-tests counts it (2(n-1)/n x algbw), #wrong from integer inputs.
Prints a JSON array in gpulab's result schema (suite "nccl_peer_torch").

    python3 bench/peers/torch_nccl.py > torch_nccl.json     # spawns one process per GPU
    torchrun --nproc_per_node=N bench/peers/torch_nccl.py      # or under torchrun
"""
import datetime
import json
import os
import statistics

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink SHARP multicast on these machines

import torch
import torch.distributed as dist


def worker(local_rank=None, world=None):
    if local_rank is not None:  # spawned by main(), not by torchrun
        os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29531"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = sorted([1 << s for s in range(13, 32, 3)] + [1 << 30])  # 8 KiB .. 2 GiB, and 1 GiB for the ratio
    free = torch.cuda.mem_get_info()[0]
    sizes = [s for s in sizes if 2 * s < free // 4]
    factor = 2 * (world - 1) / world
    results = []
    for size in sizes:
        count = size // 4
        idx = torch.arange(count, device="cuda", dtype=torch.int32)
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


def main():
    if "RANK" in os.environ:
        worker()
    else:
        world = torch.cuda.device_count()
        torch.multiprocessing.spawn(lambda_free_worker, args=(world,), nprocs=world, join=True)


def lambda_free_worker(local_rank, world):
    worker(local_rank, world)


if __name__ == "__main__":
    main()
