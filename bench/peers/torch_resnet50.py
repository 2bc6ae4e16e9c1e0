#!/usr/bin/env python3
"""PyTorch peer of `gpulab train --synthetic`: torchvision ResNet-N v1.5 training speed.

The same run as gpulab, measured the same way:
  model     torchvision resnetN(num_classes), its own initialisation, train mode
  data      one fixed random batch on the GPU (uniform -2..2, as gpulab's), labels fixed
  precision fp32: TF32 off, NCHW (PyTorch's fp32 default; --memory-format to change);
            tf32: TF32 on, channels_last; fp16: autocast + GradScaler(65536, x2/2000, x0.5),
            channels_last; bf16: autocast, channels_last
  optimizer SGD momentum 0.9 (optional Nesterov), weight decay (1e-4) on conv/fc weights only,
            cosine LR from --lr over --steps with --warmup linear steps (gpulab's default schedule);
            lamb/lars are gpulab-only (apex is not installed), so SGD is the comparison
  loss      cross-entropy, label smoothing 0.1; gradient accumulation over --accum micro-batches
  timing    --untimed steps (default 5, gpulab's), then synchronize and time the remaining steps
            with the wall clock, reading the loss every step as gpulab (and torchvision's
            reference train.py) does; img/s = timed steps x batch x accum x ranks / seconds
  parallel  under torchrun (WORLD_SIZE set): DistributedDataParallel over NCCL, one process a
            GPU, --batch per GPU, each rank its own random batch, DDP's default 25 MB buckets;
            rank 0 reports (gpulab train --gpus N is the same run)
Writes one result per precision in gpulab's JSON schema (suite train_peer).

  python3 bench/peers/torch_resnet50.py --precision fp32 tf32 fp16 bf16 --batch 256 --steps 100 --json peer.json
  build-device/src/cli/gpulab train --synthetic --precision fp16 --batch 256 --steps 100 --json gpulab.json
  torchrun --nproc-per-node 8 bench/peers/torch_resnet50.py --precision fp16 --json ddp8.json
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import subprocess
import time

import torch
import torchvision


def git_revision():
    try:
        return subprocess.check_output(["git", "describe", "--always", "--dirty"], text=True).strip()
    except Exception:
        return "unknown"


def param_groups(model, weight_decay):
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim > 1 else no_decay).append(p)  # BN weight/bias and fc.bias are 1-D
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def cosine(step, base, end, warmup, total):
    """gpulab's LrSchedule (cosine): linear warmup, then cosine from base to end."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return end + (base - end) * (1 + math.cos(math.pi * t)) / 2


UNDER_TORCHRUN = "WORLD_SIZE" in os.environ


def distributed():
    """(rank, world, local rank): torchrun's environment, or one process alone."""
    if not UNDER_TORCHRUN:
        return 0, 1, 0
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))


def run(precision, args):
    rank, world, _ = distributed()
    ddp = UNDER_TORCHRUN
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)  # the same initial weights on every rank, as DDP broadcasts anyway
    fmt = args.memory_format
    if fmt == "auto":
        fmt = "contiguous" if precision == "fp32" else "channels_last"
    memory_format = torch.channels_last if fmt == "channels_last" else torch.contiguous_format
    model = getattr(torchvision.models, f"resnet{args.depth}")(num_classes=args.classes)
    model = model.cuda().to(memory_format=memory_format).train()
    opt = torch.optim.SGD(param_groups(model, args.weight_decay), lr=args.lr, momentum=0.9, nesterov=args.nesterov)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()],
                                                          gradient_as_bucket_view=True)
        torch.manual_seed(args.seed + 1 + rank)  # each rank its own batch
    x = torch.empty(args.batch, 3, args.image_size, args.image_size, device="cuda").uniform_(-2, 2)
    x = x.contiguous(memory_format=memory_format)
    y = torch.randint(0, args.classes, (args.batch,), device="cuda")
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")

    def step(i):
        for g in opt.param_groups:
            g["lr"] = cosine(i, args.lr, 0.0, args.warmup, args.steps)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(args.accum):
            # DDP all-reduces on the last micro-batch's backward only
            sync = model.no_sync() if ddp and m + 1 < args.accum else contextlib.nullcontext()
            with sync:
                with torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                    loss = loss_fn(model(x), y)
                scaler.scale(loss / args.accum).backward()
            total = total + loss.detach()
        scaler.step(opt)
        scaler.update()
        # The step's mean loss over its micro-batches, as gpulab reports it; rank 0's under DDP.
        # The progress report's read, every step (a synchronization).
        return total.item() / args.accum

    untimed = min(args.untimed, args.steps - 1)
    first = None
    for i in range(untimed):
        loss = step(i)
        first = loss if first is None else first
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(untimed, args.steps):
        loss = step(i)
        first = loss if first is None else first
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    images = (args.steps - untimed) * args.batch * args.accum * world
    props = torch.cuda.get_device_properties(0)
    return {
        "schema": 1, "suite": "train_peer",
        "name": f"torch_resnet{args.depth}_{precision}_b{args.batch}_synthetic" + (f"_ddp{world}" if ddp else ""),
        "metric": "throughput", "value": images / seconds, "unit": "img/s", "peak": None, "fraction": None,
        "params": {"depth": args.depth, "precision": precision, "batch": args.batch, "accum": args.accum,
                   "optimizer": "sgd", "schedule": "cosine", "lr": args.lr, "steps": args.steps,
                   "untimed_steps": untimed, "image_size": args.image_size, "classes": args.classes,
                   "data": "synthetic", "gpus": world, "ddp": ddp, "first_loss": first, "last_loss": loss,
                   "timed_images": images,
                   "timed_seconds": seconds, "memory_format": fmt, "torch": torch.__version__,
                   "torchvision": torchvision.__version__, "cudnn": torch.backends.cudnn.version()},
        "gpu": {"name": props.name, "sm_clock": None, "mem_clock": None, "driver": None},
        "git": git_revision(),
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", nargs="+", default=["fp32", "tf32", "fp16", "bf16"],
                    choices=["fp32", "tf32", "fp16", "bf16"])
    ap.add_argument("--depth", type=int, default=50, choices=[18, 34, 50, 101, 152])
    ap.add_argument("--batch", type=int, default=256, help="images per micro-batch")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps, untimed ones included (gpulab's --steps)")
    ap.add_argument("--untimed", type=int, default=5, help="first steps left out of the timing (gpulab: 5)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=0, help="linear warmup steps (gpulab's --warmup)")
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--memory-format", default="auto", choices=["auto", "channels_last", "contiguous"],
                    help="auto: NCHW for fp32, channels_last otherwise")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    rank, _, local_rank = distributed()
    if UNDER_TORCHRUN:
        torch.cuda.set_device(local_rank)
        torch.distributed.init_process_group("nccl")
    results = []
    for p in args.precision:
        r = run(p, args)
        if rank != 0:
            continue
        print(f"{r['name']} ({r['params']['memory_format']}, accum {args.accum}): {r['value']:.1f} img/s "
              f"({r['params']['timed_images']} images in {r['params']['timed_seconds']:.2f} s), "
              f"loss {r['params']['first_loss']:.4f} -> {r['params']['last_loss']:.4f}")
        results.append(r)
        torch.cuda.empty_cache()
    if UNDER_TORCHRUN:
        torch.distributed.destroy_process_group()
    if args.json and rank == 0:
        with open(args.json + ".tmp", "w") as f:
            json.dump(results, f, indent=2)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
