#!/usr/bin/env python3
"""PyTorch peer of `gpulab train --synthetic`: torchvision ResNet-50 (v1.5) training speed.

Same recipe as gpulab: channels_last, SGD momentum 0.9 with weight decay 1e-4 on conv/fc weights
only, label smoothing 0.1, one fixed random batch on the GPU. Precisions: fp32 (TF32 off), tf32,
fp16 (autocast + GradScaler), bf16 (autocast). Timed with CUDA events after warmup; writes one
result per precision in gpulab's JSON schema.

  python3 bench/peers/torch_resnet50.py --precision fp32 tf32 fp16 bf16 --batch 256 --json out.json
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess

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


def run(precision, args):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = getattr(torchvision.models, f"resnet{args.depth}")(num_classes=args.classes)
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(param_groups(model, 1e-4), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, args.classes, (args.batch,), device="cuda")
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    rates = []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.steps):
            loss = step()
        end.record()
        end.synchronize()
        rates.append(args.steps * args.batch / (start.elapsed_time(end) / 1e3))
    props = torch.cuda.get_device_properties(0)
    return {
        "schema": 1, "suite": "train_peer", "name": f"torch_resnet{args.depth}_{precision}_b{args.batch}_synthetic",
        "metric": "throughput", "value": statistics.median(rates), "unit": "img/s", "peak": None, "fraction": None,
        "params": {"precision": precision, "batch": args.batch, "image_size": args.image_size, "steps": args.steps,
                   "repeats": args.repeats, "rates": rates, "last_loss": float(loss), "torch": torch.__version__,
                   "torchvision": torchvision.__version__, "cudnn": torch.backends.cudnn.version(),
                   "channels_last": True},
        "gpu": {"name": props.name, "sm_clock": None, "mem_clock": None, "driver": None},
        "git": git_revision(),
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", nargs="+", default=["fp32", "tf32", "fp16", "bf16"],
                    choices=["fp32", "tf32", "fp16", "bf16"])
    ap.add_argument("--depth", type=int, default=50, choices=[18, 34, 50, 101, 152])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=30, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    results = []
    for p in args.precision:
        r = run(p, args)
        print(f"{r['name']}: {r['value']:.1f} img/s (repeats {', '.join(f'{v:.1f}' for v in r['params']['rates'])})")
        results.append(r)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(results, f, indent=2)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
