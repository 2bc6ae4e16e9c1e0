#!/usr/bin/env python3
"""Reference tensors from torchvision for gpulab's ResNet (the issue's correctness bar).

Builds a seeded torchvision ResNet-N v1.5 and a seeded batch, runs one training-mode forward and
backward in fp32 with TF32 off, one SGD step and (from the same start) one LAMB step, and writes
everything into one safetensors file, under torchvision's state_dict names (conv weights OIHW):

  <name>              the initial state_dict (weights, BN running stats, num_batches_tracked)
  after.<name>        the state_dict after the forward (running stats updated, weights unchanged)
  grad.<param>        every parameter's gradient
  sgd.<name>          the state_dict after one torch.optim.SGD step
  lamb.<name>         the state_dict after one LAMB step (apex FusedLAMB's math in torch ops)
  input.nhwc          the batch, float32 [N][H][W][3] (gpulab's layout); labels int32 [N]
  logits              fp32 [N][classes]; loss [1] (cross-entropy, label smoothing as gpulab's trainer)
  grad64.<param>      every gradient from the same forward and backward in float64 (stored as fp32):
                      how far torch's own fp32 gradients are from exact is the noise floor of the bar
  logits.fp16/.bf16   torch autocast logits (channels_last) from the same start: torch's own
                      half-precision distance from fp32
The recipe (learning rates, decay, betas, ...) is in the file's metadata; the gpu test
ReferenceGpu.* (tests/train/test_torchvision_gpu.cpp) reads it from GPULAB_TORCHVISION_REF.

  python3 tests/reference/torchvision_resnet50.py --out /tmp/torchvision_resnet50.safetensors
  GPULAB_TORCHVISION_REF=/tmp/torchvision_resnet50.safetensors ctest --test-dir build-device -R ReferenceGpu

The tests' tolerances are set for the defaults (batch 8 at 224 px). A smaller file does not hold
them: at batch 4 and 64 px, layer4's maps are 2x2 and its batch-norm statistics come from 16 values
a channel, and two of the four tests each failed their tolerance in one of two runs there, one
plainly and one under racecheck (session 37, docs/reliability.md).
"""
import argparse
import copy

import torch
import torchvision
from safetensors.torch import save_file

SMOOTHING = 0.1  # gpulab train's default --label-smoothing
SGD = dict(lr=0.1, momentum=0.9, weight_decay=1e-4)  # torchvision's recipe
LAMB = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, max_grad_norm=1.0)


def decays(name, p):
    return p.ndim > 1  # conv and fc weights; BN weight/bias and fc.bias are 1-D: no decay


def lamb_step(model, grads):
    """apex FusedLAMB, one step from zero moments: adam_w_mode, bias correction, grad averaging,
    global grad-norm clipping at max_grad_norm, trust ratio |p|/|u| only where weight decay != 0."""
    c = LAMB
    global_norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())).float()
    clip = global_norm / c["max_grad_norm"] if global_norm > c["max_grad_norm"] else torch.ones(())
    step = 1
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = grads[name] / clip
            m = (1 - c["beta1"]) * g
            v = (1 - c["beta2"]) * g * g
            wd = c["weight_decay"] if decays(name, p) else 0.0
            u = (m / (1 - c["beta1"] ** step)) / (torch.sqrt(v / (1 - c["beta2"] ** step)) + c["eps"]) + wd * p
            ratio = 1.0
            if wd != 0:
                pn, un = p.norm(), u.norm()
                if pn > 0 and un > 0:
                    ratio = pn / un
            p.sub_(c["lr"] * ratio * u)


def state(model, prefix):
    return {prefix + k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=50, choices=[18, 34, 50, 101, 152])
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(args.seed)
    dev = "cuda"
    model = getattr(torchvision.models, f"resnet{args.depth}")(num_classes=args.classes).to(dev).train()
    # Moved BN statistics away from 0/1 so that loading them is tested, not assumed.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(7)
    x_nhwc = torch.randn(args.batch, args.image_size, args.image_size, 3, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, args.classes, (args.batch,), generator=torch.Generator().manual_seed(2))
    out = state(model, "")
    start = {k: v.clone() for k, v in model.state_dict().items()}

    x = x_nhwc.permute(0, 3, 1, 2).contiguous().to(dev)
    y = labels.to(dev)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y, label_smoothing=SMOOTHING)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    out.update(state(model, "after."))
    out.update({"grad." + n: g.cpu().contiguous() for n, g in grads.items()})
    out["input.nhwc"] = x_nhwc.contiguous()
    out["labels"] = labels.to(torch.int32)
    out["logits"] = logits.detach().cpu().contiguous()
    out["loss"] = loss.detach().cpu().reshape(1)

    # The same forward and backward from the same start in float64, and torch's half precisions.
    fresh = copy.deepcopy(model)
    fresh.load_state_dict(start)
    exact = copy.deepcopy(fresh).double()
    exact.zero_grad(set_to_none=True)  # deepcopy carries the fp32 run's .grad along
    loss64 = torch.nn.functional.cross_entropy(exact(x.double()), y, label_smoothing=SMOOTHING)
    loss64.backward()
    worst = (0.0, "")
    for n, p in exact.named_parameters():
        out["grad64." + n] = p.grad.float().cpu().contiguous()
        err = ((grads[n].double() - p.grad).norm() / p.grad.norm()).item()
        worst = max(worst, (err, n))
    print(f"torch fp32 gradients against float64: worst relative L2 {worst[0]:.3g} ({worst[1]})")
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        half = copy.deepcopy(fresh).to(memory_format=torch.channels_last)
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
            got = half(x.to(memory_format=torch.channels_last)).float()
        out["logits." + name] = got.cpu().contiguous()
        print(f"torch autocast {name} logits against fp32: relative L2 {((got - logits).norm() / logits.norm()).item():.3g}")

    decay = [p for n, p in model.named_parameters() if decays(n, p)]
    no_decay = [p for n, p in model.named_parameters() if not decays(n, p)]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": SGD["weight_decay"]},
                           {"params": no_decay, "weight_decay": 0.0}], lr=SGD["lr"], momentum=SGD["momentum"])
    opt.step()
    out.update(state(model, "sgd."))

    model.load_state_dict(start)  # LAMB from the same start: the post-forward running stats stay in "after."
    lamb_step(model, grads)
    lamb_state = state(model, "lamb.")
    for k in lamb_state:  # the BN statistics after the forward, as in the SGD case
        if "running_" in k or "num_batches_tracked" in k:
            lamb_state[k] = out["after." + k[len("lamb."):]].clone()  # save_file refuses shared storage
    out.update(lamb_state)

    meta = {"depth": str(args.depth), "classes": str(args.classes), "batch": str(args.batch),
            "image_size": str(args.image_size), "label_smoothing": str(SMOOTHING),
            "torch": torch.__version__, "torchvision": torchvision.__version__}
    meta.update({"sgd_" + k: repr(v) for k, v in SGD.items()})
    meta.update({"lamb_" + k: repr(v) for k, v in LAMB.items()})
    save_file(out, args.out, metadata=meta)
    print(f"wrote {len(out)} tensors to {args.out}: ResNet-{args.depth}, batch {args.batch}x{args.image_size}, "
          f"loss {loss.item():.6f}, global grad norm "
          f"{torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())).item():.4f}")


if __name__ == "__main__":
    main()
