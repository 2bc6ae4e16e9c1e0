#!/usr/bin/env python3
"""um_thrashing: 32 MiB of CUDA managed memory touched alternately by a kernel and by the host.

PyTorch has no managed-memory allocator, so the buffer comes from cuMemAllocManaged (driver API,
through ctypes) and is shared zero-copy: with torch via __cuda_array_interface__, with numpy via
ctypes. Every step migrates the pages to the GPU on fault and back to the host on fault; fix:
cudaMemPrefetchAsync / cudaMemAdvise, or keep the data where it is used. Mirrors
examples/um_thrashing.cu.

The PyTorch profiler records no unified-memory activity, so a --trace of this program shows only
slow kernels and a busy host; run it under `gpulab diagnose -- python3 um_thrashing.py` (the
CUPTI tracer collects the migrations and faults) to see um_thrashing.
"""
import ctypes
import mmap

import numpy as np
import torch

from common import parse_args, traced


class ManagedBuffer:
    """int32 managed memory; exposes __cuda_array_interface__ so torch.as_tensor shares it."""

    def __init__(self, n):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        ctx, dev, ptr = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_uint64()
        self._check(self.cuda.cuInit(0), "cuInit")
        self._check(self.cuda.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device()), "cuDeviceGet")
        self._check(self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._check(self.cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")  # torch's context, made current here
        self._check(self.cuda.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(4 * n), 1), "cuMemAllocManaged")
        self.ptr, self.n = ptr.value, n
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<i4", "data": (self.ptr, False), "version": 3}

    @staticmethod
    def _check(status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed with CUresult {status}")

    def host_view(self):
        return np.ctypeslib.as_array((ctypes.c_int32 * self.n).from_address(self.ptr))

    def free(self):
        self._check(self.cuda.cuMemFree_v2(ctypes.c_uint64(self.ptr)), "cuMemFree")


def main():
    args = parse_args(__doc__, steps=12, mib=32)
    n = (args.mib << 20) // 4
    page_ints = mmap.PAGESIZE // 4
    torch.zeros(1, device="cuda")  # creates torch's context first
    buf = ManagedBuffer(n)
    gpu = torch.as_tensor(buf, device="cuda")
    assert gpu.data_ptr() == buf.ptr, "torch copied the managed buffer instead of sharing it"
    host = buf.host_view()
    host[:] = 0
    with traced(args.trace, f"um_thrashing: {args.steps} host/device round trips of {args.mib} MiB"):
        for _ in range(args.steps):
            gpu.add_(1)  # GPU faults: host -> device migration
            torch.cuda.synchronize()
            host[::page_ints] += 1  # CPU faults: device -> host, page by page
    expected = np.full(n, args.steps, dtype=np.int32)
    expected[::page_ints] += args.steps
    wrong = int(np.count_nonzero(host != expected))
    del gpu, host
    buf.free()
    print(f"um_thrashing: {wrong} wrong values")
    raise SystemExit(0 if wrong == 0 else 1)


if __name__ == "__main__":
    main()
