#!/usr/bin/env python3
"""Peer for `gpulab bench gemm`: torch.matmul (fp32, tf32, fp16, bf16) and torch._scaled_mm (fp8
e4m3, per-tensor scales, bf16 out) at one square size, verified then timed with CUDA events
(median of many). Prints a JSON array in gpulab's result schema (suite "gemm_peer_torch").

    python3 bench/peers/torch_gemm.py [--size 8192] [--reps 50] > torch_gemm.json
"""
import argparse
import datetime
import json
import statistics
import subprocess

import torch

PEAKS_H200 = {"fp32": 67, "tf32": 495, "fp16": 989, "bf16": 989, "fp8e4m3": 1979}


def integers(shape, seed):
    # Small integers in [-2, 2]: every product and partial sum is exact, so results are checkable.
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=g, device="cuda").float()


def time_ms(fn, reps, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def percentile(values, p):
    s = sorted(values)
    rank = p / 100 * (len(s) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (rank - lo) * (s[hi] - s[lo])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    n = args.size
    a32, b32 = integers((n, n), 1), integers((n, n), 2)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = (a32.double() @ b32.double()).float()  # exact for these inputs

    props = torch.cuda.get_device_properties(0)
    try:
        git = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        git = "unknown"
    gpu = {"name": props.name, "sm_clock": None, "mem_clock": None, "driver": torch.version.cuda or ""}
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    cases = []
    for precision, dtype in (("fp32", torch.float32), ("tf32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        a, b = a32.to(dtype), b32.to(dtype)

        def run(a=a, b=b, precision=precision):
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            return a @ b
        cases.append((precision, run, dtype))
    if hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
        a8 = a32.to(torch.float8_e4m3fn)
        b8 = b32.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major B, as _scaled_mm wants
        one = torch.ones((), device="cuda")
        cases.append(("fp8e4m3", lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), torch.bfloat16))

    results = []
    for precision, run, out_dtype in cases:
        out = run().float()
        expect = ref.to(out_dtype).float()
        tol = 1e-2 if precision in ("tf32", "fp8e4m3") else 0.0
        wrong = int((~((out - expect).abs() <= tol * expect.abs() + (1e-2 if tol else 0))).sum())
        if wrong:
            print(f"# {precision}: {wrong} wrong elements, not timed", flush=True)
            continue
        ms = time_ms(run, args.reps)
        tflops = [2 * n ** 3 / (t * 1e-3) / 1e12 for t in ms]
        value = statistics.median(tflops)
        peak = PEAKS_H200.get(precision) if "H200" in props.name else None
        results.append({
            "schema": 1, "suite": "gemm_peer_torch", "name": f"torch_{precision}_{n}", "metric": "throughput",
            "value": value, "unit": "TFLOP/s", "peak": peak, "fraction": value / peak if peak else None,
            "params": {"m": n, "n": n, "k": n, "precision": precision, "torch": torch.__version__,
                       "median_ms": statistics.median(ms), "p10": percentile(tflops, 10), "p90": percentile(tflops, 90),
                       "min": min(tflops), "max": max(tflops), "samples": len(tflops), "verified": "tolerance" if tol else "exact"},
            "gpu": gpu, "git": git, "time": now})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
