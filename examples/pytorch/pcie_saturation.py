#!/usr/bin/env python3
"""pcie_saturation: 256 MiB pinned host-to-device copies, each followed by a tiny kernel.

The copies run at the link's ceiling while the SMs wait; fix: keep data resident on the GPU,
overlap copies with compute on another stream, or move fewer bytes. Mirrors
examples/pcie_saturation.cu.
"""
import torch

from common import parse_args, traced


def main():
    args = parse_args(__doc__, steps=12, mib=256)
    host = torch.ones(args.mib << 18).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    with traced(args.trace, f"pcie_saturation: {args.steps} pinned uploads of {args.mib} MiB"):
        for _ in range(args.steps):
            dev.copy_(host, non_blocking=True)
            check = dev[:256].sum()  # a tiny kernel: one block
    print(f"pcie_saturation: checksum {check.item():.1f}")


if __name__ == "__main__":
    main()
