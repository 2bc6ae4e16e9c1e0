#!/usr/bin/env bash
# `gpulab train --synthetic` beside PyTorch (bench/peers/torch_resnet50.py, measured the same way)
# on this GPU, against issue #5's bars, and the cost of gradient accumulation (4 micro-batches of
# 256 per step against 1, in both).
#   bench/train_vs_torch.sh [GPULAB] [OUTDIR]     (defaults: build-device/src/cli/gpulab, $OUT)
# Writes train_<precision>.json, train_fp16_accum4.json, peer_train.json, peer_train_accum4.json.
set -euo pipefail
cd "$(dirname "$0")/.."
gpulab=${1:-build-device/src/cli/gpulab}
out=${2:-${OUT:-/tmp/gpulab-out}}
mkdir -p "$out"
steps=100
for p in fp32 tf32 fp16 bf16; do
  "$gpulab" train --synthetic --precision "$p" --batch 256 --steps $steps --json "$out/train_$p.json" |
    grep throughput | sed "s/^/gpulab $p: /"
done
# The same number of micro-batches: 25 steps of 4 (5 untimed) against 100 of 1.
"$gpulab" train --synthetic --precision fp16 --batch 256 --accum 4 --steps $((steps / 4)) \
  --json "$out/train_fp16_accum4.json" | grep throughput | sed "s/^/gpulab fp16 accum 4: /"
python3 bench/peers/torch_resnet50.py --precision fp32 tf32 fp16 bf16 --batch 256 --steps $steps \
  --json "$out/peer_train.json"
python3 bench/peers/torch_resnet50.py --precision fp16 --batch 256 --accum 4 --steps $((steps / 4)) \
  --json "$out/peer_train_accum4.json"
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
value = lambda f, i=0: json.load(open(f"{out}/{f}"))[i]["value"]
peer = {r["params"]["precision"]: r["value"] for r in json.load(open(f"{out}/peer_train.json"))}
bars = {"fp32": 1.0, "tf32": 1.0, "fp16": 1.15, "bf16": None}
print(f"{'precision':<10}{'gpulab img/s':>14}{'torch img/s':>13}{'ratio':>8}  bar")
for p, bar in bars.items():
    g = value(f"train_{p}.json")
    r = g / peer[p]
    verdict = "-" if bar is None else f">= {bar:.2f} {'PASS' if r >= bar else 'FAIL'}"
    print(f"{p:<10}{g:14.1f}{peer[p]:13.1f}{r:8.3f}  {verdict}")
g1, g4 = value("train_fp16.json"), value("train_fp16_accum4.json")
t1, t4 = peer["fp16"], value("peer_train_accum4.json")
cost = 1 - g4 / g1
print(f"accum 4 vs 1 (fp16, 256 per micro-batch): gpulab {g4:.1f} vs {g1:.1f} img/s, cost {100 * cost:.1f}% "
      f"(bar <= 3%: {'PASS' if cost <= 0.03 else 'FAIL'}); torch {t4:.1f} vs {t1:.1f}, cost {100 * (1 - t4 / t1):.1f}%")
EOF
