#!/usr/bin/env bash
# A/B of `gpulab bench llm` between a base tree and this one, on the GPU machine: runs alternate
# (base, new, base, new, ...) so that drift in clocks or temperature falls on both sides alike.
# Session 10's calls did this by hand; a 1 % change needs both sides in one call.
#   Here:  mkdir -p .ab/base && git archive REV | tar -x -C .ab/base   (.ab/ is git-ignored; carry it)
#   There: scripts/ab_bench_llm.sh [--base-dir .ab/base] [--runs 2] [--env "VAR=V ..."] [-- BENCH_ARGS...]
# Builds the base's gpulab into BASE_DIR/build and this tree's into build-device/ (both with the
# carried .deps like scripts/device.sh), then runs `gpulab bench llm BENCH_ARGS` (default: the 7B
# shape, dummy weights, 128 in / 128 out, batches 1 and 16, no prefill) RUNS times on each side,
# --env applied to the new side only (an A/B of a switch: the same tree on both sides). Writes
# ab_{base,new}_runN.{json,txt} to $OUT and prints each run's ms a step and fraction of the floor.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpulab-out}
base_dir=.ab/base runs=2 new_env=""
bench_args=(--config llama2-7b --dummy-weights --input 128 --output 128 --batch 1,16 --prefill 0)
while (($#)); do
  case $1 in
    --base-dir) base_dir=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --env) new_env=$2; shift 2 ;;
    --) shift; bench_args=("$@"); break ;;
    *) echo "ab_bench_llm.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
mapfile -t prefix < <(scripts/unpack_device_deps.sh)  # the carried .deps, if any
build() {  # source dir, build dir, log
  { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" &&
    cmake --build "$2" -j "$(($(nproc) / 2))" --target gpulab; } >"$3" 2>&1
}
[[ -d $base_dir ]] || { echo "ab_bench_llm.sh: no base tree in $base_dir (see the header)" >&2; exit 2; }
build "$base_dir" "$base_dir/build" "$out/ab_build_base.log" & base_pid=$!
build . build-device "$out/ab_build_new.log" & new_pid=$!
wait $base_pid || { tail -20 "$out/ab_build_base.log"; echo "ab_bench_llm.sh: base build failed" >&2; exit 1; }
wait $new_pid || { tail -20 "$out/ab_build_new.log"; echo "ab_bench_llm.sh: build failed" >&2; exit 1; }
status=0
for ((r = 1; r <= runs; ++r)); do
  for side in base new; do
    bin=$base_dir/build/src/cli/gpulab env=()
    if [[ $side == new ]]; then bin=build-device/src/cli/gpulab; read -ra env <<<"$new_env"; fi
    name=ab_${side}_run$r
    env "${env[@]}" "$bin" bench llm "${bench_args[@]}" --json "$out/$name.json" >"$out/$name.txt" 2>&1 || status=1
    # The table's rows: batch, in/out, TTFT, ms a step, p90, tokens/s, end-to-end, floor, of floor.
    echo "$side run $r: $(awk '$1 ~ /^[0-9]+$/ && NF >= 9 {printf "batch %s %s ms (%s)  ", $1, $4, $9}' "$out/$name.txt")"
  done
done
exit $status
