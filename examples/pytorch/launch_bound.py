#!/usr/bin/env python3
"""launch_bound: many tiny element-wise ops on a small tensor, each its own ~2 us kernel.

The GPU finishes every kernel before Python and the dispatcher have issued the next one; fix:
CUDA graphs (torch.cuda.graphs / torch.compile mode="reduce-overhead"), fusion, or more work per op.
Mirrors examples/launch_bound.cu; `gpulab diagnose` should name launch_bound.
"""
import torch

from common import parse_args, traced


def main():
    args = parse_args(__doc__, steps=300)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.zeros(8 * sms * 256, device="cuda")  # grid covers the SMs: short, not small
    for _ in range(20):
        x.mul_(1.0001).add_(0.5)
    torch.cuda.synchronize()
    with traced(args.trace, f"launch_bound: {2 * args.steps} tiny kernels"):
        for _ in range(args.steps):
            x.mul_(1.0001).add_(0.5)


if __name__ == "__main__":
    main()
