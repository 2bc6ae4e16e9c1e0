#!/usr/bin/env bash
# Replays every fuzz target's seed corpus, then fuzzes each target for a bounded time.
#   scripts/fuzz.sh [SECONDS_PER_TARGET (default 30; 0: replay only)] [TARGET ...]
# Builds (if needed) the clang + AddressSanitizer + UndefinedBehaviorSanitizer + libFuzzer tree in
# build-fuzz/. New inputs libFuzzer finds go to build-fuzz/fuzz-corpus/<target>/, crashing ones to
# build-fuzz/fuzz-artifacts/<target>/ (add those to tests/fuzz/corpus/<target>/ with a test once
# fixed). Runs GPULAB_FUZZ_PARALLEL targets at once (default: the core count). Prints executions
# per target; exits 1 when a target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
build=${GPULAB_FUZZ_BUILD:-build-fuzz}
cxx=$(command -v clang++ || command -v clang++-14 || true)
if [[ -z $cxx ]]; then
  echo "fuzz.sh: clang++ is needed (apt-get install clang libclang-rt-dev)" >&2
  exit 1
fi
# The tree runs host code only (fuzz targets, `cpu` tests), so its kernels are built as PTX
# alone (90-virtual): no machine-code pass, about 40 % off each .cu file's compile.
if [[ ! -f $build/build.ninja ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
    -DGPULAB_CUDA_ARCHS=90-virtual -DGPULAB_SANITIZE=address,undefined -DGPULAB_FUZZ=ON \
    ${GPULAB_FUZZ_CMAKE_ARGS:-} >/dev/null
fi
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp | sed 's/^fuzz_//')"); done
fi
cmake --build "$build" -j "${GPULAB_FUZZ_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
row_format='%-18s %8s %12s %10s %8s  %s\n'
# Each target's replay and fuzzing run as a job, GPULAB_FUZZ_PARALLEL (default: the core count)
# at once; each job writes its table row, printed in target order at the end.
fuzz_one() {
  local t=$1 exe=$build/tests/fuzz/fuzz_$1 seeds=tests/fuzz/corpus/$1 work=$build/fuzz-corpus/$1
  local artifacts=$build/fuzz-artifacts/$1/ log=$build/fuzz-logs/$1.log result=ok
  mkdir -p "$work" "$artifacts"
  # Replay first: a seed that crashes is a regression, whatever fuzzing finds afterwards.
  if ! "$exe" -runs=0 "$seeds" >"$log" 2>&1; then
    result="REPLAY CRASH (see $log)"
  elif ((seconds > 0)) &&
       ! "$exe" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
           -artifact_prefix="$artifacts" "$work" "$seeds" >>"$log" 2>&1; then
    result="CRASH: $(ls -t "$artifacts" | head -1) (see $log)"
  fi
  local execs rate units
  execs=$(awk '/^stat::number_of_executed_units:/ {v = $2} END {print v}' "$log")
  rate=$(awk '/^stat::average_exec_per_sec:/ {v = $2} END {print v}' "$log")
  units=$(find "$work" "$seeds" -type f | wc -l)
  printf "$row_format" "$t" "$seconds" "${execs:--}" "${rate:--}" "$units" "$result" >"$build/fuzz-logs/$t.row"
}
parallel=${GPULAB_FUZZ_PARALLEL:-$(nproc)}
mkdir -p "$build/fuzz-logs"
for t in "${targets[@]}"; do
  rm -f "$build/fuzz-logs/$t.row"
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  fuzz_one "$t" &
done
wait
failed=0
printf "$row_format" target seconds execs "execs/s" corpus result
for t in "${targets[@]}"; do
  row=$(cat "$build/fuzz-logs/$t.row" 2>/dev/null || echo "$t  (no result)")
  echo "$row"
  if [[ $row != *"  ok" ]]; then
    failed=1
    tail -40 "$build/fuzz-logs/$t.log"  # the report, with the input in Base64 (CI keeps no files)
  fi
done
exit $failed
