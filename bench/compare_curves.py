#!/usr/bin/env python3
"""Compares two training loss curves: gpulab's (`gpulab train --json`) and a peer's
(bench/peers/torch_resnet_curve.py), both with params.loss_curve.

Single steps are noisy (one batch each), so curves are compared as means over windows of
--window steps; the verdict is on the last window (issue #5: within 5 % after 300 steps), and
on validation top-1 against chance (1 / classes) where both ran an evaluation.

One seed per side cannot tell a recipe difference from the spread between seeds: each side may
be several runs (comma-separated files, e.g. one per --seed). Their per-step mean is compared,
and each side's spread of last-window losses is printed beside it.

  python3 bench/compare_curves.py gpulab_curve.json torch_curve.json [--window 30] [--tolerance 0.05]
  python3 bench/compare_curves.py g0.json,g1.json,g2.json t0.json,t1.json,t2.json
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


def load_side(paths):
    """One or more runs (comma-separated): the first run's result, every curve, every validation."""
    runs = [load(p) for p in paths.split(",") if p]
    if not runs:
        sys.exit(f"no result files in '{paths}'")
    return runs[0][0], [c for _, c in runs], [r["params"].get("val") for r, _ in runs]


def mean_curve(curves, n):
    return [sum(c[i] for c in curves) / len(curves) for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gpulab", help="gpulab's result file(s), comma-separated")
    ap.add_argument("peer", help="the peer's result file(s), comma-separated")
    ap.add_argument("--window", type=int, default=30)
    ap.add_argument("--tolerance", type=float, default=0.05, help="relative difference of the last windows")
    args = ap.parse_args()
    (ra, ca, va), (rb, cb, vb) = load_side(args.gpulab), load_side(args.peer)
    n = min(len(c) for c in ca + cb)
    if any(len(c) != n for c in ca + cb):
        print(f"note: runs of {sorted({len(c) for c in ca + cb})} steps; comparing the first {n}")
    wa, wb = windows(mean_curve(ca, n), args.window), windows(mean_curve(cb, n), args.window)
    if len(ca) > 1 or len(cb) > 1:
        print(f"means of {len(ca)} gpulab and {len(cb)} peer runs")
    print(f"{'steps':>11} {'gpulab':>8} {'peer':>8} {'diff':>7}")
    for i, (x, y) in enumerate(zip(wa, wb)):
        lo, hi = i * args.window, min(n, (i + 1) * args.window) - 1
        print(f"{lo:>5}-{hi:<5} {x:8.4f} {y:8.4f} {100 * (x - y) / y:6.1f}%")
    for name, curves in (("gpulab", ca), ("peer", cb)):
        if len(curves) > 1:
            last = [windows(c[:n], args.window)[-1] for c in curves]
            print(f"{name} runs' last-window losses: {' '.join(f'{v:.4f}' for v in last)} "
                  f"(spread {100 * (max(last) - min(last)) / min(last):.1f}%)")
    ok = True
    rel = abs(wa[-1] - wb[-1]) / wb[-1]
    verdict = "PASS" if rel <= args.tolerance else "FAIL"
    ok &= rel <= args.tolerance
    print(f"{verdict}: last {args.window} steps' mean loss gpulab {wa[-1]:.4f}, peer {wb[-1]:.4f} "
          f"({100 * rel:.1f}% apart, tolerance {100 * args.tolerance:.0f}%)")
    classes = ra["params"].get("classes") or rb["params"].get("classes")
    for name, vals in (("gpulab", va), ("peer", vb)):
        if not classes or not all(vals):
            continue
        chance = 1.0 / classes
        top1 = sum(v["top1"] for v in vals) / len(vals)
        loss = sum(v["loss"] for v in vals) / len(vals)
        good = all(v["top1"] >= 3 * chance for v in vals)
        ok &= good
        each = " (runs: " + " ".join(f"{100 * v['top1']:.1f}" for v in vals) + ")" if len(vals) > 1 else ""
        print(f"{'PASS' if good else 'FAIL'}: {name} validation top-1 {100 * top1:.1f}%{each} "
              f"(chance {100 * chance:.1f}%, bar 3x chance), loss {loss:.4f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
