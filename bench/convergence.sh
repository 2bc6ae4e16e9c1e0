#!/usr/bin/env bash
# Issue #5's convergence check: the same recipe by gpulab and by PyTorch
# (bench/peers/torch_resnet_curve.py) on one `gpulab dataset make --kind shapes` folder for 300
# steps; bench/compare_curves.py puts the loss curves side by side (within 5 % at the end) and
# checks validation top-1 against chance.
#   bench/convergence.sh [GPULAB] [OUTDIR] [PRECISION]   (build-device/src/cli/gpulab, $OUT, bf16)
# SEEDS="0 1 2": one run per seed on each side, the mean curves compared and each side's spread
# shown (one seed cannot tell a recipe difference from seed noise). SAME_INIT=1: gpulab starts
# from the peer's initial weights (--save-init / --init-from), so only data order, augmentation
# draws and arithmetic differ.
set -euo pipefail
cd "$(dirname "$0")/.."
gpulab=${1:-build-device/src/cli/gpulab}
out=${2:-${OUT:-/tmp/gpulab-out}}
precision=${3:-bf16}
seeds=${SEEDS:-0}
mkdir -p "$out"
data=$(mktemp -d /tmp/gpulab_shapes.XXXXXX)
trap 'rm -rf "$data"' EXIT
rmdir "$data"
"$gpulab" dataset make "$data" --classes 12 --images 300 --val 50 --kind shapes
# ResNet-18 at 64 px, batch 64: 56 batches an epoch, 300 steps ~ 5 epochs. lr 0.05 is the
# reference 0.1 per 256 images scaled to 64 and doubled: a short run, with warmup.
recipe=(--depth 18 --image-size 64 --batch 64 --steps 300 --lr 0.05 --warmup 20 --precision "$precision")
ours=() theirs=()
for seed in $seeds; do
  suffix=$([ "$seeds" = 0 ] && echo "" || echo "_s$seed")
  init=()
  peer_init=()
  if [ "${SAME_INIT:-0}" = 1 ]; then
    peer_init=(--save-init "$out/torch_init$suffix.safetensors")
    init=(--init-from "$out/torch_init$suffix.safetensors")
  fi
  python3 bench/peers/torch_resnet_curve.py --data "$data" "${recipe[@]}" --seed "$seed" "${peer_init[@]}" \
      --json "$out/torch_curve$suffix.json"
  "$gpulab" train --data "$data" "${recipe[@]}" --seed "$seed" "${init[@]}" --eval --json "$out/gpulab_curve$suffix.json"
  ours+=("$out/gpulab_curve$suffix.json")
  theirs+=("$out/torch_curve$suffix.json")
done
join() { local IFS=,; echo "$*"; }
python3 bench/compare_curves.py "$(join "${ours[@]}")" "$(join "${theirs[@]}")" | tee "$out/curves.txt"
