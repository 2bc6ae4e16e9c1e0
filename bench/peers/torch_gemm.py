#!/usr/bin/env python3
"""Peer for `gpulab bench gemm`: torch.matmul (fp32, tf32, fp16, bf16) and torch._scaled_mm (fp8
e4m3, per-tensor scales, bf16 out) at one square size, verified then timed. Prints a JSON array in
gpulab's result schema (suite "gemm_peer_torch").

    python3 bench/peers/torch_gemm.py [--size 8192] [--samples 20] > torch_gemm.json

The protocol is gpulab's (src/bench/timing.cpp, docs/benchmarks.md), step for step, so the ratio
of the two compares the libraries and not the stopwatches: the same integer inputs in [-2, 2],
the same output types (fp16/bf16 products write fp16/bf16), inputs rotated among as many copies
as exceed twice the L2, one timed call to size a sample, at least 100 ms of warm-up, then
`--samples` samples (gpulab: 20, 10 with --quick) of back-to-back calls between two CUDA events,
each sample at least 5 ms long; the figure is the median over samples.
"""
import argparse
import datetime
import itertools
import json
import math
import statistics
import subprocess

import torch

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}  # gpulab's names
PEAKS_H200 = {"fp32": 67, "tf32": 495, "fp16": 989, "bf16": 989, "fp8e4m3": 1979}


def integers(shape, seed):
    # Small integers in [-2, 2]: every product and partial sum is exact, so results are checkable.
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=g, device="cuda").float()


def time_ms(enqueue, samples, min_sample_ms=5.0, warmup_ms=100.0):
    """Milliseconds per call, one entry per sample: gpulab's time_on_stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run(calls):
        start.record()
        for _ in range(calls):
            enqueue()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    first = max(run(1), 1e-4)
    calls = min(max(math.ceil(min_sample_ms / first), 1), 10000)
    warm = first
    while warm < warmup_ms:
        warm += run(calls)
    return [run(calls) / calls for _ in range(samples)]


def input_sets(in_bytes, l2_bytes):
    """Copies of the inputs that together exceed twice the L2 (gpulab's gemm suite)."""
    return min(max((2 * l2_bytes + 2 * in_bytes - 1) // (2 * in_bytes), 1), 64)


def percentile(values, p):
    s = sorted(values)
    rank = p / 100 * (len(s) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (rank - lo) * (s[hi] - s[lo])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--samples", type=int, default=20, help="samples per figure (gpulab: 20, 10 with --quick)")
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

    l2 = getattr(props, "L2_cache_size", 0)
    cases = []  # (precision, output dtype, inputs: a list of (a, b) sets, the product of one set)
    for precision, dtype in (("fp32", torch.float32), ("tf32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        sets = [(a32.to(dtype), b32.to(dtype))]
        sets += [(integers((n, n), 1000 + s).to(dtype), integers((n, n), 2000 + s).to(dtype))
                 for s in range(1, input_sets(n * n * sets[0][0].element_size(), l2))]
        out = torch.empty((n, n), dtype=dtype, device="cuda")
        cases.append((precision, dtype, sets, lambda ab, out=out: torch.matmul(ab[0], ab[1], out=out)))
    if hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
        one = torch.ones((), device="cuda")

        def fp8(a, b):  # B column-major, as _scaled_mm wants
            return a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()
        sets = [fp8(a32, b32)]
        sets += [fp8(integers((n, n), 1000 + s), integers((n, n), 2000 + s)) for s in range(1, input_sets(n * n, l2))]
        cases.append(("fp8e4m3", torch.bfloat16, sets,
                      lambda ab: torch._scaled_mm(ab[0], ab[1], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)))

    results = []
    for precision, out_dtype, sets, product in cases:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        got = product(sets[0]).float()
        expect = ref.to(out_dtype).float()
        tol = 1e-2 if precision in ("tf32", "fp8e4m3") else 0.0
        wrong = int((~((got - expect).abs() <= tol * expect.abs() + (1e-2 if tol else 0))).sum())
        if wrong:
            print(f"# {precision}: {wrong} wrong elements, not timed", flush=True)
            continue
        rotation = itertools.cycle(sets)
        ms = time_ms(lambda: product(next(rotation)), args.samples)
        tflops = [2 * n ** 3 / (t * 1e-3) / 1e12 for t in ms]
        value = statistics.median(tflops)
        peak = PEAKS_H200.get(precision) if "H200" in props.name else None
        results.append({
            "schema": 1, "suite": "gemm_peer_torch", "name": f"torch_{precision}_{n}", "metric": "throughput",
            "value": value, "unit": "TFLOP/s", "peak": peak, "fraction": value / peak if peak else None,
            "params": {"m": n, "n": n, "k": n, "precision": precision, "torch": torch.__version__,
                       "output": DTYPE_NAMES[out_dtype], "input_sets": len(sets),
                       "median_ms": statistics.median(ms), "p10": percentile(tflops, 10), "p90": percentile(tflops, 90),
                       "min": min(tflops), "max": max(tflops), "samples": len(tflops), "verified": "tolerance" if tol else "exact",
                       "protocol": "gpulab: >= 100 ms warm-up, samples of back-to-back calls >= 5 ms, median"},
            "gpu": gpu, "git": git, "time": now})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
