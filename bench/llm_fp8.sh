#!/usr/bin/env bash
# fp8 decode on one GPU (issue #7): the LLaMA-2-70B shape with fp8 weights (fits one H200), and
# the LLaMA-2-7B shape in fp8 beside bf16; random weights made on the device, 128 prompt tokens,
# 128 generated, batch 1 and 16. Each run's JSON and log go to $OUT; the summary line gives
# tokens/s beside the floor "every weight byte read once per step" at BW bytes/s (default the
# H200's measured 4.27 TB/s device copy).
#   OUT=dir bench/llm_fp8.sh [path/to/gpulab]
set -euo pipefail
gpulab=${1:-build-device/src/cli/gpulab}
out=${OUT:-/tmp/gpulab-out}
bw=${BW:-4.27e12}
mkdir -p "$out"
ids=$(seq -s, 1 128)
run() {  # name, batch, generate options...
  local name=$1 batch=$2
  shift 2
  "$gpulab" generate --dummy-weights --ids "$ids" --max-tokens 128 --ignore-eos --json --batch "$batch" "$@" \
    >"$out/$name.json" 2>"$out/$name.log"
  local tps gib
  tps=$(grep -o '"tokens_per_second": [0-9.e+-]*' "$out/$name.json" | awk '{print $2}')
  gib=$(grep -o 'weights [0-9.]* GiB' "$out/$name.log" | awk '{print $2}')
  awk -v n="$name" -v t="$tps" -v g="$gib" -v b="$batch" -v bw="$bw" 'BEGIN {
    floor = b / (g * 2^30 / bw);
    printf "%-22s %9.1f tokens/s   weights %6.2f GiB   floor %9.1f tokens/s   %5.1f %% of floor\n", n, t, g, floor, 100 * t / floor }'
}
for b in 1 16; do
  run "llama2-7b-bf16-b$b" "$b" --config llama2-7b --weights bf16
  run "llama2-7b-fp8-b$b" "$b" --config llama2-7b --weights fp8
  run "llama2-70b-fp8-b$b" "$b" --config llama2-70b --weights fp8
done | tee "$out/llm_fp8.txt"
