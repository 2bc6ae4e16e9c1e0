#!/usr/bin/env bash
# `gpulab train --synthetic` beside PyTorch (bench/peers/torch_resnet50.py, measured the same way)
# on this GPU, against issue #5's bars, and the cost of gradient accumulation (4 micro-batches of
# 256 per step against 1, in both).
#   bench/train_vs_torch.sh [GPULAB] [OUTDIR]     (defaults: build-device/src/cli/gpulab, $OUT)
# Writes train_<precision>.json, peer_train_<precision>.json, train_fp16_accum4.json, peer_train_accum4.json.
# STEPS=N (default 100) and PRECISIONS="fp16 tf32 ..." (default all four) shorten a run; each
# precision runs gpulab then torch back to back, so a run cut short still has same-call pairs.
set -euo pipefail
cd "$(dirname "$0")/.."
gpulab=${1:-build-device/src/cli/gpulab}
out=${2:-${OUT:-/tmp/gpulab-out}}
mkdir -p "$out"
steps=${STEPS:-100}
precisions=${PRECISIONS:-"fp16 tf32 bf16 fp32"}
for p in $precisions; do
  "$gpulab" train --synthetic --precision "$p" --batch 256 --steps "$steps" --json "$out/train_$p.json" |
    grep throughput | sed "s/^/gpulab $p: /"
  python3 bench/peers/torch_resnet50.py --precision "$p" --batch 256 --steps "$steps" --json "$out/peer_train_$p.json"
done
# The same number of micro-batches: steps/4 steps of 4 (5 untimed) against steps of 1.
"$gpulab" train --synthetic --precision fp16 --batch 256 --accum 4 --steps $((steps / 4)) \
  --json "$out/train_fp16_accum4.json" | grep throughput | sed "s/^/gpulab fp16 accum 4: /"
python3 bench/peers/torch_resnet50.py --precision fp16 --batch 256 --accum 4 --steps $((steps / 4)) \
  --json "$out/peer_train_accum4.json"
python3 - "$out" $precisions <<'EOF'
import json, sys
out, precisions = sys.argv[1], sys.argv[2:]
value = lambda f, i=0: json.load(open(f"{out}/{f}"))[i]["value"]
bars = {"fp32": 1.0, "tf32": 1.0, "fp16": 1.15, "bf16": None}
print(f"{'precision':<10}{'gpulab img/s':>14}{'torch img/s':>13}{'ratio':>8}  bar")
for p in precisions:
    g, t, bar = value(f"train_{p}.json"), value(f"peer_train_{p}.json"), bars[p]
    r = g / t
    verdict = "-" if bar is None else f">= {bar:.2f} {'PASS' if r >= bar else 'FAIL'}"
    print(f"{p:<10}{g:14.1f}{t:13.1f}{r:8.3f}  {verdict}")
g1, g4 = value("train_fp16.json"), value("train_fp16_accum4.json")
t1, t4 = value("peer_train_fp16.json"), value("peer_train_accum4.json")
cost = 1 - g4 / g1
print(f"accum 4 vs 1 (fp16, 256 per micro-batch): gpulab {g4:.1f} vs {g1:.1f} img/s, cost {100 * cost:.1f}% "
      f"(bar <= 3%: {'PASS' if cost <= 0.03 else 'FAIL'}); torch {t4:.1f} vs {t1:.1f}, cost {100 * (1 - t4 / t1):.1f}%")
EOF
