#!/usr/bin/env bash
# Faults against `gpulab train` checkpoints, on the GPU machine (issue #11's list):
#  1. kill -9 at random moments (mid-step, mid-checkpoint-write), then --resume, until the run
#     finishes: the final weights and checkpoint must equal an uninterrupted run's, byte for byte;
#  2. a disk that fills up: a checkpoint written under a file-size limit (ulimit -f) and, as root,
#     into a tiny tmpfs: a clear error, and the previous checkpoint still there and loadable.
#   scripts/fault_train.sh [GPULAB] [KILLS]      (default build-device/src/cli/gpulab, 6 kills)
# Prints PASS/FAIL per check; exits 1 when any check failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
gpulab=${1:-build-device/src/cli/gpulab}
kills=${2:-6}
[[ -x $gpulab ]] || gpulab=build/src/cli/gpulab
work=$(mktemp -d /tmp/gpulab_fault.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0
check() {  # check NAME CONDITION...
  local name=$1
  shift
  if "$@"; then echo "PASS $name"; else echo "FAIL $name"; failed=1; fi
}
step_of() {  # the step recorded in a checkpoint's metadata
  python3 -c 'import json,struct,sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
print(json.loads(f.read(n))["__metadata__"]["step"])' "$1"
}

# ResNet-18 at 64x64: ~95 MB checkpoints, a few steps per second, so kills land everywhere.
recipe=(--synthetic --depth 18 --image-size 64 --batch 32 --steps 40 --optimizer lamb --precision fp16
        --deterministic --seed 7)

echo "== uninterrupted run"
"$gpulab" train "${recipe[@]}" --checkpoint "$work/ref" --checkpoint-every 5 --export "$work/ref.safetensors" \
  >"$work/ref.log" 2>&1
check "uninterrupted run" test $? -eq 0

echo "== kill -9 at random moments, then --resume ($kills kills)"
dir=$work/killed
resume=()
for ((i = 0; i < kills; i++)); do
  delay=$(python3 -c "import random; print(round(random.uniform(1.0, 6.0), 2))")
  timeout -s KILL "$delay" "$gpulab" train "${recipe[@]}" --checkpoint "$dir" --checkpoint-every 1 \
    --export "$work/killed.safetensors" "${resume[@]}" >>"$work/killed.log" 2>&1
  rc=$?
  at=$([[ -f $dir/checkpoint.safetensors ]] && step_of "$dir/checkpoint.safetensors" || echo none)
  echo "   run $i: killed after ${delay}s (exit $rc), checkpoint at step $at"
  [[ $rc -eq 0 ]] && break
  [[ $at != none ]] && resume=(--resume)
done
"$gpulab" train "${recipe[@]}" --checkpoint "$dir" --checkpoint-every 1 --export "$work/killed.safetensors" \
  "${resume[@]}" >>"$work/killed.log" 2>&1
check "resume after the last kill finishes" test $? -eq 0
check "final weights equal the uninterrupted run's" cmp -s "$work/ref.safetensors" "$work/killed.safetensors"
check "final checkpoint equals the uninterrupted run's" \
  cmp -s "$work/ref/checkpoint.safetensors" "$dir/checkpoint.safetensors"
check "no temporary files left" test -z "$(find "$dir" -name '*.tmp.*')"

echo "== a full disk: file-size limit"
dir=$work/limited
# Checkpoints every 2 of 20 steps: the kill lands long before the last, so a resume has to write.
small=(--synthetic --depth 18 --image-size 64 --batch 32 --steps 20 --deterministic --checkpoint "$dir"
       --checkpoint-every 2)
"$gpulab" train "${small[@]}" >"$work/limited.log" 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null && [[ ! -f $dir/checkpoint.safetensors ]]; do sleep 0.05; done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
check "a first checkpoint exists" test -f "$dir/checkpoint.safetensors"
before=$(step_of "$dir/checkpoint.safetensors")
size_kb=$(($(stat -c %s "$dir/checkpoint.safetensors") / 1024))
(ulimit -f $((size_kb / 2)); exec "$gpulab" train "${small[@]}" --resume) >"$work/limited2.log" 2>&1
rc=$?
echo "   exit $rc: $(grep gpulab: "$work/limited2.log" | head -1)"
check "the limited write fails with exit 1" test $rc -eq 1
check "the error names the file and the cause" grep -q "cannot write .*checkpoint.safetensors: File too large" \
  "$work/limited2.log"
check "the previous checkpoint is intact" test "$(step_of "$dir/checkpoint.safetensors")" = "$before"
"$gpulab" train "${small[@]}" --resume >>"$work/limited.log" 2>&1
check "and resumes to the end once there is room" test $? -eq 0

if [[ $(id -u) -eq 0 ]] && mkdir -p "$work/tmpfs" && mount -t tmpfs -o size=150m tmpfs "$work/tmpfs" 2>/dev/null; then
  echo "== a full disk: 150 MB tmpfs (room for one ~95 MB checkpoint, not for its replacement)"
  "$gpulab" train "${small[@]/$dir/$work/tmpfs/c}" >"$work/tmpfs.log" 2>&1
  rc=$?
  echo "   exit $rc: $(grep gpulab: "$work/tmpfs.log" | head -1)"
  check "the full tmpfs write fails with exit 1" test $rc -eq 1
  check "the error says no space" grep -q "No space left on device" "$work/tmpfs.log"
  check "the first checkpoint is intact" test "$(step_of "$work/tmpfs/c/checkpoint.safetensors")" = 2
  umount "$work/tmpfs"
else
  echo "SKIP tmpfs (needs root and mount)"
fi

((failed)) && { echo "fault_train.sh: FAILED (logs were in $work)"; tail -5 "$work"/*.log; exit 1; }
echo "fault_train.sh: all checks passed"
