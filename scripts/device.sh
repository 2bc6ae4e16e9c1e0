#!/usr/bin/env bash
# The one-call GPU workflow (DESIGN.md): run on the GPU machine from the repository root.
#   scripts/device.sh [--bench "SUITE ..."] [--bench-args "..."] [--peers "SCRIPT ..."]
#                     [--tests REGEX] [--label cpu|gpu] [--no-tests] [--test-timeout S] [--per-test S]
# 1. unpacks carried .deb dependencies (.deps/*.deb) into .deps/root,
# 2. configures and builds with Ninja on all cores into build-device/,
# 3. runs every test (cpu and gpu labels), 4. records `gpulab info`,
# 5. runs the named bench suites and peer scripts (bench/peers/), writing JSON and logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpulab-out}
mkdir -p "$out"
bench="" bench_args="" peers="" tests="" label="" run_tests=1 test_timeout=420 per_test=300
while (($#)); do
  case $1 in
    --bench) bench=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --no-tests) run_tests=0; shift ;;
    --test-timeout) test_timeout=$2; shift 2 ;;   # all tests together
    --per-test) per_test=$2; shift 2 ;;           # one test: a hang costs no more than this
    *) echo "device.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# Multi-GPU machines here must never use NVLink multicast.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

mapfile -t prefix < <(scripts/unpack_device_deps.sh)  # the carried .deps, if any

{
  nvidia-smi
  nvidia-smi topo -m
  nvcc --version | tail -1
  cmake --version | head -1
} >"$out/machine.txt" 2>&1

start=$(date +%s)
if ! { cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" &&
       cmake --build build-device -j "$(nproc)"; } >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  echo "device.sh: BUILD FAILED (full log in build.log)"
  exit 1
fi
echo "device.sh: built in $(($(date +%s) - start)) s"

gpulab=build-device/src/cli/gpulab
"$gpulab" info | tee "$out/info.txt"
"$gpulab" info --json >"$out/info.json"

if ((run_tests)); then
  ctest_args=(--test-dir build-device --output-on-failure -j 4 --timeout "$per_test")
  [[ -n $tests ]] && ctest_args+=(-R "$tests")
  [[ -n $label ]] && ctest_args+=(-L "$label")
  start=$(date +%s)
  timeout "$test_timeout" ctest "${ctest_args[@]}" >"$out/ctest.log" 2>&1
  echo "device.sh: tests took $(($(date +%s) - start)) s"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run" "$out/ctest.log" | head -40
fi

if [[ -n $bench ]]; then
  # shellcheck disable=SC2086
  "$gpulab" bench $bench $bench_args --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
fi
for p in $peers; do
  echo "== peer $p"
  python3 "bench/peers/$p" 2>&1 | tee -a "$out/peers.txt"
done
