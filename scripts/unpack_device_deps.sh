#!/usr/bin/env bash
# Run THERE (the GPU machine), from any folder: unpacks the .deb files scripts/fetch_device_deps.sh
# put in .deps/ (carried with the tree) into .deps/root, and prints the CMake flag that points the
# build at them, one line; prints nothing when none were carried. scripts/device.sh,
# ab_bench_llm.sh and sanitizer_queues.sh configure with it:
#   mapfile -t prefix < <(scripts/unpack_device_deps.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
compgen -G ".deps/*.deb" >/dev/null || exit 0
mkdir -p .deps/root
for f in .deps/*.deb; do dpkg -x "$f" .deps/root; done
echo "-DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr"
