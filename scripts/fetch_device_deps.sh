#!/usr/bin/env bash
# Run HERE (Debian, with a package registry) before a GPU run: downloads the .deb files of the
# build dependencies the GPU machine may lack into .deps/ (git-ignored), to be carried there
# and unpacked there by scripts/unpack_device_deps.sh. The same list every time; see docs/gpu-workflow.md.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(nlohmann-json3-dev libcli11-dev libgtest-dev libpcre2-dev libpcre2-8-0 libturbojpeg0-dev libturbojpeg0)
mkdir -p .deps
cd .deps
rm -f ./*.deb
apt-get download "${packages[@]}" >/dev/null
ls -1 ./*.deb
