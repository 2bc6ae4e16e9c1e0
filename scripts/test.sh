#!/usr/bin/env bash
# One command on a fresh machine: install what is missing, build, run every test.
# Tests labelled `gpu` skip with a reason where no CUDA device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600
