#!/usr/bin/env python3
"""Compares two training loss curves: gpulab's (`gpulab train --json`) and a peer's
(bench/peers/torch_resnet_curve.py), both with params.loss_curve.

Single steps are noisy (one batch each), so curves are compared as means over windows of
--window steps; the verdict is on the last window (issue #5: within 5 % after 300 steps), and
on validation top-1 against chance (1 / classes) where both ran an evaluation.

  python3 bench/compare_curves.py gpulab_curve.json torch_curve.json [--window 30] [--tolerance 0.05]
Exits 1 when the last windows differ by more than the tolerance or an accuracy is near chance.
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    r = data[0] if isinstance(data, list) else data
    curve = [float("nan") if v is None else float(v) for v in r["params"]["loss_curve"]]
    return r, curve


def windows(curve, w):
    return [sum(curve[i:i + w]) / len(curve[i:i + w]) for i in range(0, len(curve), w)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gpulab")
    ap.add_argument("peer")
    ap.add_argument("--window", type=int, default=30)
    ap.add_argument("--tolerance", type=float, default=0.05, help="relative difference of the last windows")
    args = ap.parse_args()
    (ra, a), (rb, b) = load(args.gpulab), load(args.peer)
    n = min(len(a), len(b))
    if len(a) != len(b):
        print(f"note: {len(a)} and {len(b)} steps; comparing the first {n}")
    wa, wb = windows(a[:n], args.window), windows(b[:n], args.window)
    print(f"{'steps':>11} {'gpulab':>8} {'peer':>8} {'diff':>7}")
    for i, (x, y) in enumerate(zip(wa, wb)):
        lo, hi = i * args.window, min(n, (i + 1) * args.window) - 1
        print(f"{lo:>5}-{hi:<5} {x:8.4f} {y:8.4f} {100 * (x - y) / y:6.1f}%")
    ok = True
    rel = abs(wa[-1] - wb[-1]) / wb[-1]
    verdict = "PASS" if rel <= args.tolerance else "FAIL"
    ok &= rel <= args.tolerance
    print(f"{verdict}: last {args.window} steps' mean loss gpulab {wa[-1]:.4f}, peer {wb[-1]:.4f} "
          f"({100 * rel:.1f}% apart, tolerance {100 * args.tolerance:.0f}%)")
    classes = ra["params"].get("classes") or rb["params"].get("classes")
    for name, r in (("gpulab", ra), ("peer", rb)):
        val = r["params"].get("val")
        if not val or not classes:
            continue
        chance = 1.0 / classes
        good = val["top1"] >= 3 * chance
        ok &= good
        print(f"{'PASS' if good else 'FAIL'}: {name} validation top-1 {100 * val['top1']:.1f}% "
              f"(chance {100 * chance:.1f}%, bar 3x chance), loss {val['loss']:.4f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
