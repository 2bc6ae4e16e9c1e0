#!/usr/bin/env python3
"""sync_memcpy: .item() after every ~60 us kernel, as a loop logging its loss every step does.

.item() copies the value into pageable host memory with cudaMemcpyAsync, which returns only once
the GPU has run everything queued before it and the copy is done (then cudaStreamSynchronize);
the GPU drains and waits for the host to launch again. Fix: accumulate on the GPU and read once
per N steps, or copy into pinned memory with non_blocking=True and read after an event.
"""
import torch

from common import parse_args, traced


def main():
    args = parse_args(__doc__, steps=200, mib=128)
    x = torch.rand(args.mib << 18, device="cuda")
    y = torch.sin(x)  # one element-wise kernel streaming 2 x mib MiB: ~60 us at 128 on an H200
    torch.cuda.synchronize()
    total = 0.0
    with traced(args.trace, f"sync_memcpy: {args.steps} kernels, each followed by .item()"):
        for _ in range(args.steps):
            torch.sin(x, out=y)
            total += y[0].item()
    print(f"sync_memcpy: checksum {total:.3f}")


if __name__ == "__main__":
    main()
