#!/usr/bin/env python3
"""PyTorch peer of `gpulab train --data DIR`: the same recipe on the same JPEG folder, for a loss
curve to set beside gpulab's (bench/compare_curves.py).

  data       torchvision ImageFolder(DIR/train), shuffled, full batches; train transform
             RandomResizedCrop(size, scale 0.08-1, ratio 3/4-4/3, bilinear, antialias) +
             RandomHorizontalFlip + ToTensor + Normalize(ImageNet mean/std), as gpulab's CPU loader
  model      torchvision resnetN(num_classes = classes in the folder), channels_last (NCHW for fp32)
  precision  fp32 (TF32 off), tf32, fp16 (autocast + GradScaler), bf16 (autocast)
  optimizer  SGD momentum 0.9 (weight decay 1e-4 on conv/fc weights only), cosine LR with linear
             warmup per step (gpulab's LrSchedule), label smoothing 0.1
  eval       DIR/val: Resize(size * 256/224) + CenterCrop(size), top-1 and loss (gpulab's --eval)
Writes gpulab's JSON schema with params.loss_curve (the loss of every step) and params.val.
--save-init PATH writes the initial weights (torchvision names, safetensors) for
`gpulab train --init-from PATH`: both sides then start from the same weights.

  gpulab dataset make /tmp/shapes --classes 12 --images 300 --val 50 --kind shapes
  python3 bench/peers/torch_resnet_curve.py --data /tmp/shapes --depth 18 --image-size 64 --batch 64 \\
      --steps 300 --lr 0.2 --warmup 20 --precision bf16 --json torch_curve.json
  gpulab train --data /tmp/shapes --depth 18 --image-size 64 --batch 64 --steps 300 --lr 0.2 --warmup 20 \\
      --precision bf16 --eval --json gpulab_curve.json
  python3 bench/compare_curves.py gpulab_curve.json torch_curve.json
"""
import argparse
import datetime
import json
import math
import os
import subprocess

import torch
import torchvision
from torchvision import transforms

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def git_revision():
    try:
        return subprocess.check_output(["git", "describe", "--always", "--dirty"], text=True).strip()
    except Exception:
        return "unknown"


def cosine(step, base, end, warmup, total):
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return end + (base - end) * (1 + math.cos(math.pi * t)) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder with train/<class>/*.JPEG and val/<class>/*.JPEG")
    ap.add_argument("--depth", type=int, default=18, choices=[18, 34, 50, 101, 152])
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--lr-end", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "fp16", "bf16"])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--save-init", help="write the initial weights here (safetensors, for gpulab --init-from)")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.benchmark = True
    size = args.image_size
    train_tf = transforms.Compose([
        transforms.RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                                     interpolation=transforms.InterpolationMode.BILINEAR, antialias=True),
        transforms.RandomHorizontalFlip(), transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    eval_tf = transforms.Compose([
        transforms.Resize(int(size * 256 / 224), interpolation=transforms.InterpolationMode.BILINEAR, antialias=True),
        transforms.CenterCrop(size), transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    train_dir = os.path.join(args.data, "train") if os.path.isdir(os.path.join(args.data, "train")) else args.data
    train = torchvision.datasets.ImageFolder(train_dir, train_tf)
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=True, persistent_workers=True,
                                         generator=torch.Generator().manual_seed(args.seed))
    classes = len(train.classes)
    fmt = torch.contiguous_format if args.precision == "fp32" else torch.channels_last
    model = getattr(torchvision.models, f"resnet{args.depth}")(num_classes=classes).cuda().to(memory_format=fmt)
    if args.save_init:
        from safetensors.torch import save_file
        save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, args.save_init)
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": args.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")

    def batches():
        while True:
            yield from loader

    it = batches()
    curve = []
    model.train()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = cosine(step, args.lr, args.lr_end, args.warmup, args.steps)
        opt.zero_grad(set_to_none=True)
        for _ in range(args.accum):
            x, y = next(it)
            x = x.cuda(non_blocking=True).contiguous(memory_format=fmt)
            y = y.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                loss = loss_fn(model(x), y)
            scaler.scale(loss / args.accum).backward()
        scaler.step(opt)
        scaler.update()
        curve.append(loss.item())
        if step % 50 == 0 or step + 1 == args.steps:
            print(f"step {step}: loss {curve[-1]:.4f}, lr {opt.param_groups[0]['lr']:.4g}")

    val = None
    val_dir = os.path.join(args.data, "val")
    if os.path.isdir(val_dir):
        ds = torchvision.datasets.ImageFolder(val_dir, eval_tf)
        model.eval()
        correct, loss_sum = 0, 0.0
        with torch.no_grad(), torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            for x, y in torch.utils.data.DataLoader(ds, batch_size=args.batch, num_workers=args.workers):
                z = model(x.cuda().contiguous(memory_format=fmt)).float()
                y = y.cuda()
                correct += (z.argmax(1) == y).sum().item()
                loss_sum += torch.nn.functional.cross_entropy(z, y, label_smoothing=args.label_smoothing,
                                                              reduction="sum").item()
        val = {"images": len(ds), "top1": correct / len(ds), "loss": loss_sum / len(ds)}
        print(f"validation: top-1 {100 * val['top1']:.2f}% of {len(ds)} images, loss {val['loss']:.4f}")

    result = {
        "schema": 1, "suite": "train_peer",
        "name": f"torch_resnet{args.depth}_{args.precision}_b{args.batch}_folder",
        "metric": "last_loss", "value": sum(curve[-30:]) / len(curve[-30:]), "unit": "loss", "peak": None,
        "fraction": None,
        "params": {"depth": args.depth, "precision": args.precision, "batch": args.batch, "accum": args.accum,
                   "optimizer": "sgd", "schedule": "cosine", "lr": args.lr, "warmup": args.warmup,
                   "steps": args.steps, "image_size": size, "classes": classes, "data": args.data,
                   "loss_curve": curve, "val": val, "torch": torch.__version__,
                   "torchvision": torchvision.__version__},
        "gpu": {"name": torch.cuda.get_device_properties(0).name, "sm_clock": None, "mem_clock": None,
                "driver": None},
        "git": git_revision(),
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump([result], f, indent=2)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
