#!/usr/bin/env bash
# One command on a fresh machine: install what is missing, build, run every test.
# Tests labelled `gpu` skip with a reason where no CUDA device is visible.
# Then (docs/reliability.md) the `cpu` tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# (a clang build in build-fuzz/, whose cpu tests also replay every fuzz corpus), and each libFuzzer
# target fuzzed for GPULAB_FUZZ_SECONDS (default 10: CI has 30 minutes; the long rounds are
# scripts/fuzz.sh 300, docs/reliability.md). GPULAB_TEST_SANITIZE=0 skips both.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
stage() { echo "test.sh: $1 done at $(($(date +%s) - started)) s"; }
scripts/install_deps.sh
scripts/build.sh
stage "build"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600
stage "tests"

if [[ ${GPULAB_TEST_SANITIZE:-1} != 0 ]]; then
  # fuzz.sh configures build-fuzz (clang, sanitizers, libFuzzer) and builds the fuzz targets.
  scripts/fuzz.sh 0 >/dev/null
  cmake --build build-fuzz -j "$(nproc)" --target cpu_tests
  stage "sanitizer build"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:protect_shadow_gap=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-fuzz -L cpu --output-on-failure -j "$(nproc)" --timeout 900
  stage "cpu tests under ASan+UBSan"
  scripts/fuzz.sh "${GPULAB_FUZZ_SECONDS:-10}"
  stage "fuzzing"
fi
