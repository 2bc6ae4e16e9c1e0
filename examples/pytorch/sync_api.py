#!/usr/bin/env python3
"""sync_api: torch.cuda.synchronize() (cudaDeviceSynchronize) after every ~60 us kernel.

Each time the GPU drains and waits for the host to notice and launch again; fix: synchronize once
per N steps, or use events between streams. Mirrors examples/sync_api.cu.
"""
import torch

from common import parse_args, traced


def main():
    args = parse_args(__doc__, steps=300, mib=128)
    x = torch.rand(args.mib << 18, device="cuda")
    y = torch.sin(x)  # one element-wise kernel streaming 2 x mib MiB: ~60 us at 128 on an H200
    torch.cuda.synchronize()
    with traced(args.trace, f"sync_api: {args.steps} kernels, each followed by torch.cuda.synchronize()"):
        for _ in range(args.steps):
            torch.sin(x, out=y)
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
