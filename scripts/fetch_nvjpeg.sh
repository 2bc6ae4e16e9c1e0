#!/usr/bin/env bash
# nvJPEG's header and library for building the GPU pipeline on a machine whose CUDA toolkit lacks
# them (the GPU machine's toolkit has them; CMake finds those without help). Unpacks NVIDIA's
# `nvidia-nvjpeg` wheel (CUDA 13.0's nvJPEG) into .nvjpeg/ (git-ignored) and prints the flag:
#   scripts/fetch_nvjpeg.sh && cmake -S . -B build ... -DGPULAB_NVJPEG_ROOT=$PWD/.nvjpeg/nvidia/cu13
set -euo pipefail
cd "$(dirname "$0")/.."
version=${NVJPEG_VERSION:-13.0.1.86}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip download "nvidia-nvjpeg==$version" --no-deps -d "$tmp" >/dev/null
mkdir -p .nvjpeg
unzip -q -o "$tmp"/nvidia_nvjpeg-*.whl -d .nvjpeg
echo "-DGPULAB_NVJPEG_ROOT=$PWD/.nvjpeg/nvidia/cu13"
