#!/usr/bin/env bash
# Installs the build dependencies gpulab needs that are missing (Debian 12 / Ubuntu 24.04).
# The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL, CUPTI) must already be installed: it comes from
# NVIDIA's packages or the CUDA container image, not from the distribution.
set -euo pipefail

packages=(cmake ninja-build g++ git pkg-config libgtest-dev nlohmann-json3-dev libcli11-dev
          libpcre2-dev libturbojpeg0-dev clang libclang-rt-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "gpulab: installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "gpulab: the CUDA toolkit (nvcc) was not found. Install CUDA 13 (https://developer.nvidia.com/cuda-downloads)" >&2
  echo "        or build inside nvidia/cuda:13.0.*-cudnn-devel-ubuntu24.04 (see Dockerfile)." >&2
  exit 1
fi
