#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck, racecheck, initcheck and synccheck over every `gpu` test
# executable (those `ctest -L gpu` runs) on a machine with a GPU, and prints a summary table.
#   scripts/compute_sanitizer.sh [--build DIR] [--tools "memcheck racecheck initcheck synccheck"]
#                                [--only EXE_REGEX] [--filter GTEST_FILTER] [--timeout S] [--leak-check]
# Each executable runs whole (all its tests) once per tool. Logs go to $OUT/compute-sanitizer/
# (or DIR/compute-sanitizer/). Exit 1 when any run reports an error or fails.
# Notes: the diagnose tests inject CUPTI into their child programs; compute-sanitizer also hooks
# the CUDA driver, so test_trace_gpu results are only meaningful for tests that do not trace.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build-device tools="memcheck racecheck initcheck synccheck" only="" filter="" timeout_s=1800 leak_check=0
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --tools) tools=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --leak-check) leak_check=1; shift ;;  # memcheck also reports device memory never freed
    *) echo "compute_sanitizer.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[[ -x $sanitizer ]] || { echo "compute_sanitizer.sh: compute-sanitizer not found" >&2; exit 1; }
[[ -d $build ]] || { echo "compute_sanitizer.sh: no build in $build (scripts/device.sh --no-tests builds one)" >&2; exit 1; }
out=${OUT:-$build}/compute-sanitizer
mkdir -p "$out"

# The executables behind the gpu-labelled tests (each TEST is `exe --gtest_filter=...`).
mapfile -t exes < <(ctest --test-dir "$build" -L gpu --show-only=json-v1 |
  python3 -c 'import json, sys; print("\n".join(sorted({t["command"][0] for t in json.load(sys.stdin)["tests"] if t.get("command")})))')
((${#exes[@]})) || { echo "compute_sanitizer.sh: no gpu tests in $build" >&2; exit 1; }

status=0
summary=$out/summary.txt
printf '%-28s %-10s %6s %8s  %s\n' executable tool exit seconds errors | tee "$summary"
for exe in "${exes[@]}"; do
  name=$(basename "$exe")
  [[ -n $only && ! $name =~ $only ]] && continue
  for tool in $tools; do
    log=$out/$name.$tool.log
    args=(--tool "$tool" --error-exitcode 99 --print-limit 50 --target-processes all)
    [[ $tool == memcheck && $leak_check == 1 ]] && args+=(--leak-check full)
    start=$(date +%s)
    timeout "$timeout_s" "$sanitizer" "${args[@]}" "$exe" ${filter:+--gtest_filter="$filter"} >"$log" 2>&1
    code=$?
    errors=$(grep -ho 'ERROR SUMMARY: [0-9]* error' "$log" | awk '{s += $3} END {print s + 0}')
    [[ $code == 0 && $errors == 0 ]] || status=1
    note=$errors
    ((code == 124)) && note="$errors (timed out)"
    printf '%-28s %-10s %6s %8s  %s\n' "$name" "$tool" "$code" "$(($(date +%s) - start))" "$note" | tee -a "$summary"
  done
done
echo "compute_sanitizer.sh: logs and summary in $out"
exit $status
