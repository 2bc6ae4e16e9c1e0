#!/usr/bin/env python3
"""healthy: bf16 8192^3 matmuls (~1.5 ms each on an H200) queued back to back, one synchronize.

`gpulab diagnose` should find nothing of high severity. Mirrors examples/healthy.cu.
"""
import torch

from common import parse_args, traced


def main():
    args = parse_args(__doc__, steps=60, size=8192)
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16) / args.size**0.5
    c = torch.empty_like(a)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    with traced(args.trace, f"healthy: {args.steps} matmuls of {args.size}^3 back to back"):
        for _ in range(args.steps):
            torch.matmul(a, b, out=c)
    print(f"healthy: checksum {c.float().abs().mean().item():.4f}")


if __name__ == "__main__":
    main()
