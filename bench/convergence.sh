#!/usr/bin/env bash
# Issue #5's convergence check: the same recipe by gpulab and by PyTorch
# (bench/peers/torch_resnet_curve.py) on one `gpulab dataset make --kind shapes` folder for 300
# steps; bench/compare_curves.py puts the loss curves side by side (within 5 % at the end) and
# checks validation top-1 against chance.
#   bench/convergence.sh [GPULAB] [OUTDIR] [PRECISION]   (build-device/src/cli/gpulab, $OUT, bf16)
set -euo pipefail
cd "$(dirname "$0")/.."
gpulab=${1:-build-device/src/cli/gpulab}
out=${2:-${OUT:-/tmp/gpulab-out}}
precision=${3:-bf16}
mkdir -p "$out"
data=$(mktemp -d /tmp/gpulab_shapes.XXXXXX)
trap 'rm -rf "$data"' EXIT
rmdir "$data"
"$gpulab" dataset make "$data" --classes 12 --images 300 --val 50 --kind shapes
# ResNet-18 at 64 px, batch 64: 56 batches an epoch, 300 steps ~ 5 epochs. lr 0.05 is the
# reference 0.1 per 256 images scaled to 64 and doubled: a short run, with warmup.
recipe=(--depth 18 --image-size 64 --batch 64 --steps 300 --lr 0.05 --warmup 20 --precision "$precision")
"$gpulab" train --data "$data" "${recipe[@]}" --eval --json "$out/gpulab_curve.json"
python3 bench/peers/torch_resnet_curve.py --data "$data" "${recipe[@]}" --json "$out/torch_curve.json"
python3 bench/compare_curves.py "$out/gpulab_curve.json" "$out/torch_curve.json" | tee "$out/curves.txt"
