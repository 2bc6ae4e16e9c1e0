"""Shared by the PyTorch pathology programs in this folder.

Each program sets up its tensors, warms up (CUDA context, cuBLAS handles, caching allocator), then
runs its measured part inside `traced(path)`: with `--trace FILE` that part is profiled by
torch.profiler (CPU + CUDA activities) and written as a Chrome trace (Kineto JSON), which
`gpulab diagnose --trace FILE` reads. Without --trace it runs unprofiled, e.g. under
`gpulab diagnose -- python3 PROGRAM`.
"""
import argparse
import contextlib
import sys
import time

import torch


def parse_args(doc, **defaults):
    """--trace FILE plus one integer option per keyword (e.g. steps=500 gives --steps)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", metavar="FILE", help="profile the measured part and write a Chrome trace here")
    for name, value in defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=value, help=f"default {value}")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"{sys.argv[0]}: needs a CUDA device", file=sys.stderr)
        sys.exit(3)
    return args


@contextlib.contextmanager
def traced(path, label):
    """Runs the body (profiled when `path` is set), waits for the GPU, prints the wall time."""
    start = time.perf_counter()
    if path:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            yield
            torch.cuda.synchronize()
        prof.export_chrome_trace(path)
    else:
        yield
        torch.cuda.synchronize()
    print(f"{label}: {1e3 * (time.perf_counter() - start):.1f} ms" + (f", trace in {path}" if path else ""))
