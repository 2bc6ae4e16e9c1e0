#!/usr/bin/env python3
"""host_starved: ~10 ms of numpy preprocessing per batch feeding ~2 ms of GPU work.

The GPU waits for the host's data pipeline most of the time; fix: preprocess on the GPU, or in
DataLoader worker processes (num_workers > 0) that prepare batches ahead. Mirrors
examples/host_starved.cu.
"""
import time

import numpy as np
import torch

from common import parse_args, traced


def preprocess(rng, ms):
    """A CPU "decode and augment" step: random images normalised, flipped and pooled for `ms` ms."""
    end = time.perf_counter() + ms / 1e3
    batch = None
    while time.perf_counter() < end or batch is None:
        images = rng.random((16, 3, 64, 64), dtype=np.float32)
        images = (images - images.mean(axis=(2, 3), keepdims=True)) / (images.std(axis=(2, 3), keepdims=True) + 1e-5)
        images = np.ascontiguousarray(images[:, :, :, ::-1])
        pooled = images.reshape(16, 3, 32, 2, 32, 2).mean(axis=(3, 5)).reshape(16, -1)
        batch = pooled if batch is None else 0.5 * (batch + pooled)
    return np.ascontiguousarray(batch, dtype=np.float32)  # 16 x 3072


def main():
    args = parse_args(__doc__, steps=30, host_ms=10, layers=6)
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(0)
    w = torch.randn(2048, 2048, device="cuda") / 2048**0.5
    state = torch.randn(2048, 2048, device="cuda")

    def step(batch):
        x = torch.from_numpy(batch).to("cuda", non_blocking=True)
        h = state + x.mean()
        for _ in range(args.layers):  # ~0.3 ms each on an H200
            h = torch.tanh(h @ w)
        return h

    step(preprocess(rng, 1))
    torch.cuda.synchronize()
    with traced(args.trace, f"host_starved: {args.steps} steps of {args.host_ms} ms numpy + GPU work"):
        for _ in range(args.steps):
            out = step(preprocess(rng, args.host_ms))
    print(f"host_starved: checksum {out.float().mean().item():.4f}")


if __name__ == "__main__":
    main()
