#!/usr/bin/env bash
# One command on a fresh machine: install what is missing, build, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
gpulab=build/src/cli/gpulab

status=0
"$gpulab" info || status=$?
if [[ $status -eq 0 ]]; then
  if "$gpulab" bench --list >/dev/null 2>&1; then
    "$gpulab" bench --quick --json build/bench-quick.json
    echo "gpulab: results written to build/bench-quick.json"
  fi
elif [[ $status -eq 3 ]]; then
  echo "gpulab: no CUDA device visible here, GPU work skipped (the lines above say why)."
  if "$gpulab" logits --help >/dev/null 2>&1; then
    echo "gpulab: running the bundled tiny LLaMA through the CPU reference instead:"
    "$gpulab" logits --model tests/data/llama_tiny --ids 1,2,3,4 --device cpu --out build/tiny-logits.safetensors
    "$gpulab" inspect build/tiny-logits.safetensors
  fi
else
  exit "$status"
fi
