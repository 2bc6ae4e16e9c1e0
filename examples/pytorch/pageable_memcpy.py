#!/usr/bin/env python3
"""pageable_memcpy: a non-pinned CPU tensor copied with .to("cuda", non_blocking=True).

non_blocking does nothing for pageable memory: the driver stages the copy through a pinned bounce
buffer, synchronously and at a fraction of the link's speed; fix: pin_memory() (or a DataLoader
with pin_memory=True) and keep non_blocking=True. Mirrors examples/pageable_memcpy.cu.
"""
import torch

from common import parse_args, traced


def main():
    args = parse_args(__doc__, steps=12, mib=64)
    host = torch.ones(args.mib << 18)  # float32: mib MiB, pageable
    x = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    with traced(args.trace, f"pageable_memcpy: {args.steps} pageable uploads of {args.mib} MiB"):
        for _ in range(args.steps):
            x = host.to("cuda", non_blocking=True)
            x.mul_(1.5)


if __name__ == "__main__":
    main()
