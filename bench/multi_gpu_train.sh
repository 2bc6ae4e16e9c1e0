#!/usr/bin/env bash
# Issue #10's runs on every GPU this machine shows (1 to 8), in parts that fit one device call
# each or all together (PARTS, default "speed peer jpeg check"):
#   speed  gpulab train --synthetic --precision fp16 --batch 256 (per GPU) --gpus G for G = 1, 2,
#          4, 8 up to the GPUs: img/s and the scaling efficiency against one GPU (bar: 90 %);
#   peer   PyTorch DDP (torchrun, AMP, channels_last: bench/peers/torch_resnet50.py) on 1 and all
#          GPUs, the same run; gpulab / torch reported;
#   jpeg   the GPU pipeline (nvJPEG decode + CUDA augmentation) on a synthetic JPEG folder, 1 and
#          all GPUs;
#   check  fp32 on the JPEG folder, 20 steps, 256 images a step: all GPUs x 256/N against one GPU
#          accumulating N micro-batches of 256/N (the same images in the same order: data/shard.h),
#          with SyncBN off. Also one GPU x 256 in one batch, and all GPUs with --sync-bn, which
#          equal each other in the maths; the first pair differs by BatchNorm's statistics (over
#          256/N images against 256). Bar: losses within 1e-3 relative.
#   bench/multi_gpu_train.sh [GPULAB] [OUTDIR]   (defaults: build-device/src/cli/gpulab, $OUT)
# STEPS (default 100) shortens the speed runs. Each run logs to OUTDIR/NAME.log and writes
# OUTDIR/NAME.json; a failed run is reported and the rest still run (exit 1 at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
gpulab=${1:-build-device/src/cli/gpulab}
out=${2:-${OUT:-/tmp/gpulab-out}}
mkdir -p "$out"
parts=${PARTS:-"speed peer jpeg check"}
steps=${STEPS:-100}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi -L | wc -l)
((gpus > 8)) && gpus=8
counts=$(for g in 1 2 4 8; do ((g <= gpus)) && echo $g; done)
source bench/part.sh
has() { [[ " $parts " == *" $1 "* ]]; }

if has speed; then
  for g in $counts; do
    part train_fp16_g$g "$gpulab" train --synthetic --precision fp16 --batch 256 --steps "$steps" --gpus "$g" \
      --json "$out/train_fp16_g$g.json"
  done
fi
if has peer; then
  for g in $(printf '%s\n' 1 "$gpus" | sort -un); do
    part peer_ddp_g$g torchrun --standalone --nproc-per-node "$g" bench/peers/torch_resnet50.py --precision fp16 \
      --batch 256 --steps "$steps" --json "$out/peer_ddp_g$g.json"
  done
fi
if has jpeg || has check; then
  data=${DATA:-/tmp/gpulab_multi_gpu_jpeg}
  [[ -d $data/train ]] || part dataset "$gpulab" dataset make "$data" --classes 40 --images 300 --val 0 \
    --threads "$(nproc)"
fi
if has jpeg; then
  for g in $(printf '%s\n' 1 "$gpus" | sort -un); do
    part train_jpeg_gpu_g$g "$gpulab" train --data "$data" --pipeline gpu --precision fp16 --batch 256 --steps 60 \
      --gpus "$g" --json "$out/train_jpeg_gpu_g$g.json"
  done
fi
if has check; then
  b=$((256 / gpus))
  check=(--data "$data" --precision fp32 --steps 20)
  part check_ranks "$gpulab" train "${check[@]}" --gpus "$gpus" --batch $b --json "$out/check_ranks.json"
  part check_accum "$gpulab" train "${check[@]}" --gpus 1 --batch $b --accum "$gpus" --json "$out/check_accum.json"
  part check_one_batch "$gpulab" train "${check[@]}" --gpus 1 --batch 256 --json "$out/check_one_batch.json"
  part check_sync_bn "$gpulab" train "${check[@]}" --gpus "$gpus" --batch $b --sync-bn --json "$out/check_sync_bn.json"
fi

python3 - "$out" "$gpus" <<'EOF'
import json, os, sys
out, gpus = sys.argv[1], int(sys.argv[2])

def result(name):
    path = f"{out}/{name}.json"
    if not os.path.exists(path):
        return None
    data = json.load(open(path))
    rows = data["results"] if isinstance(data, dict) else data
    return rows[0] if rows else None

one = result("train_fp16_g1")
for g in (1, 2, 4, 8):
    r = result(f"train_fp16_g{g}")
    if r:
        eff = f", scaling efficiency {100 * r['value'] / (g * one['value']):.1f} % (bar 90 %)" if one and g > 1 else ""
        print(f"gpulab fp16 synthetic, {g} GPU(s) x 256: {r['value']:.0f} img/s{eff}")
for g in sorted({1, gpus}):
    t, r = result(f"peer_ddp_g{g}"), result(f"train_fp16_g{g}")
    if t:
        ratio = f"; gpulab / torch {r['value'] / t['value']:.3f}" if r else ""
        print(f"torch DDP fp16, {g} GPU(s) x 256: {t['value']:.0f} img/s{ratio}")
for g in sorted({1, gpus}):
    r = result(f"train_jpeg_gpu_g{g}")
    if r:
        print(f"gpulab fp16 JPEG folder, GPU pipeline ({r['params'].get('decoder')}), {g} GPU(s) x 256: "
              f"{r['value']:.0f} img/s")

def curve(name):
    r = result(name)
    return r["params"]["loss_curve"] if r else None

def worst(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and b and len(a) == len(b) else None

b = 256 // gpus
pairs = [("check_ranks", "check_accum", f"{gpus} GPUs x {b} vs 1 GPU accumulating {gpus} x {b} (bar 1e-3)"),
         ("check_sync_bn", "check_one_batch", f"{gpus} GPUs x {b} with --sync-bn vs 1 GPU x 256"),
         ("check_ranks", "check_one_batch", f"{gpus} GPUs x {b} without SyncBN vs 1 GPU x 256 (BN statistics differ)")]
for a, b, what in pairs:
    w = worst(curve(a), curve(b))
    if w is not None:
        print(f"fp32 losses over 20 steps, {what}: worst relative difference {w:.2e}")
EOF
exit $failed
