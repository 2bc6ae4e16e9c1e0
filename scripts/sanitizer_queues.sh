#!/usr/bin/env bash
# One device call of compute-sanitizer work (docs/reliability.md): run on the GPU machine from the
# repository root, with .deps carried (scripts/fetch_device_deps.sh).
#   CALL=N [LIMIT=S] [TARGETS="gpulab test_train_gpu"] scripts/sanitizer_queues.sh QUEUE ...
#   QUEUE = 'NAME;TOOLS;JOBS;TIMEOUT;ONLY[;EXCLUDE[;all]]', e.g.
#           'llm;racecheck;1;560;CudaEngine\.(BatchedGreedy|Fp8Decode)'
#           'train;racecheck-ours;4;540;^TrainerGpu\.' (racecheck, the libraries' kernels unchecked:
#           scripts/compute_sanitizer.sh says when)
# Builds TARGETS into build-device (a warm machine keeps it: a later call rebuilds nothing), then
# runs each queue (scripts/compute_sanitizer.sh with TOOLS, --jobs JOBS, --timeout TIMEOUT, --only
# ONLY, --exclude EXCLUDE) beside the others, all ending LIMIT s (default 560) after the call began.
# A queue runs only the (test, tool) pairs without a clean (or racecheck "library only") run in
# bench/results or in this machine's earlier calls, shortest first, unless its last field is `all`.
# Mind host memory: racecheck holds ~11 MiB a launch until the host waits, and the ResNet waits at
# each layer under it since session 41 (four training runs at once: 2-5 GiB each), but runs of
# cuBLASLt's GEMMs at 7B shapes took 56-118 GiB even so (sessions 42-43): each distinct racy kernel
# adds hazard records that no wait gives back (13-15 GiB for one nvjet GEMM in session 43's probe),
# and autotuning met up to 16 such kernels a shape. With it off under racecheck (session 44) the
# 2-layer fp8 7B engine took 8.2 GiB (117.9 before), the random 7B 20.7, the LLM GEMM table 56.6,
# and the decode suite used up the machine (124.7 GiB; bench timing has run two calls under
# racecheck since): run those alone.
# What comes back is four files under $OUT (the device tool returns at most eight):
#   build.log, callN-memory.log (available host memory and used GPU memory every 10 s),
#   callN-sanitizer.txt (each queue's summary under a "## call N, queue NAME: ..." line, ready for
#   bench/results), callN-logs.tgz (every run's log).
# BUILD, RESULTS and QUEUES_DIR (the calls' work, default /tmp/sanitizer-queues) move the build
# folder, the record and the work elsewhere (tests/scripts/test_sanitizer_scripts.py does).
# REFERENCES=1 also makes, beside the build and unless a warm machine has them, what the
# ReferenceGpu and RandomSevenB tests compare with (tests/reference/: torchvision's ResNet-50,
# about 40 s; a random LLaMA-2-7B with transformers' logits, about 74 s; session 42), and points
# the tests at them; the queues start once both are there.
set -uo pipefail
cd "$(dirname "$0")/.."
(($#)) || { echo "usage: CALL=N scripts/sanitizer_queues.sh 'NAME;TOOLS;JOBS;TIMEOUT;ONLY[;EXCLUDE[;all]]' ..." >&2; exit 2; }
call=${CALL:-1} limit=${LIMIT:-560} targets=${TARGETS:-"gpulab test_train_gpu"}
build=${BUILD:-build-device} results=${RESULTS:-bench/results} runs=${QUEUES_DIR:-/tmp/sanitizer-queues}
out=${OUT:-$runs/out}
work=$runs/call$call
mkdir -p "$out" "$work"
begin=$(date +%s)
export NCCL_NVLS_ENABLE=0  # multi-GPU machines here must never use NVLink multicast

(
  while :; do
    printf '%s s: host available %s GiB, GPU used %s\n' "$(($(date +%s) - begin))" \
      "$(awk '/MemAvailable/ {printf "%.1f", $2 / 1048576}' /proc/meminfo)" \
      "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | paste -sd,)"
    sleep 10
  done
) > "$out/call$call-memory.log" 2>&1 &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

references=()
if [[ ${REFERENCES:-0} == 1 ]]; then
  export GPULAB_TORCHVISION_REF=$runs/torchvision_resnet50.safetensors GPULAB_HF_REFERENCE_DIR=$runs/llama7b-random
  if [[ ! -s $GPULAB_TORCHVISION_REF ]]; then
    (timeout 300 python3 tests/reference/torchvision_resnet50.py --out "$GPULAB_TORCHVISION_REF.part" &&
      mv "$GPULAB_TORCHVISION_REF.part" "$GPULAB_TORCHVISION_REF") > "$work/reference-torchvision.log" 2>&1 &
    references+=($!)
  fi
  if [[ ! -f $GPULAB_HF_REFERENCE_DIR/reference.safetensors ]]; then
    (rm -rf "$GPULAB_HF_REFERENCE_DIR.part" &&
      timeout 300 python3 tests/reference/hf_llama_random.py --out "$GPULAB_HF_REFERENCE_DIR.part" &&
      mv "$GPULAB_HF_REFERENCE_DIR.part" "$GPULAB_HF_REFERENCE_DIR") > "$work/reference-llama7b.log" 2>&1 &
    references+=($!)
  fi
fi

mapfile -t prefix < <(scripts/unpack_device_deps.sh)  # the carried .deps, if any
(
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  start=$(date +%s)
  # shellcheck disable=SC2086
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" &&
    cmake --build "$build" -j "$(nproc)" --target $targets
  code=$?
  echo "sanitizer_queues.sh: call $call built $targets: exit $code in $(($(date +%s) - start)) s"
  exit $code
) > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
tail -1 "$out/build.log"
for pid in "${references[@]}"; do
  wait "$pid" || echo "sanitizer_queues.sh: a reference failed: its tests will skip (logs: $work/reference-*.log)"
done

# This machine's earlier calls count as record, as the results folder does.
earlier=()
for d in "$runs"/call*; do [[ $d != "$work" ]] && earlier+=(--left "$d" --shortest-first "$d"); done
deadline=$((limit - ($(date +%s) - begin) - 15))  # 15 s to gather what comes back
echo "sanitizer_queues.sh: the queues get $deadline s"

names=() headers=() pids=()
for queue in "$@"; do
  IFS=';' read -r name tools jobs timeout only exclude all <<< "$queue"
  record=(--left "$results" "${earlier[@]}")
  [[ $all == all ]] && record=()
  header="## call $call, queue $name: $tools, --jobs $jobs, --timeout $timeout, --only '$only'"
  [[ -n $exclude ]] && header+=", --exclude '$exclude'"
  [[ $all == all ]] && header+=" (every pair, clean on record or not)"
  OUT=$work/$name scripts/compute_sanitizer.sh --build "$build" --tools "$tools" --jobs "$jobs" \
    --timeout "$timeout" --deadline "$deadline" --only "$only" --exclude "$exclude" \
    --shortest-first "$results" "${record[@]}" > "$work/$name.console" 2>&1 &
  names+=("$name") headers+=("$header") pids+=($!)
done
wait "${pids[@]}"

# Each queue's summary, also copied where a later call's --left reads it.
for i in "${!names[@]}"; do
  name=${names[$i]} summary=$work/${names[$i]}/compute-sanitizer/summary.txt
  echo "${headers[$i]}"
  if [[ -f $summary ]]; then
    tail -n +2 "$summary"
    cp "$summary" "$work/queue-$name-sanitizer.txt"
  fi
  grep -v '^compute_sanitizer.sh: logs' "$work/$name.console" | grep '^compute_sanitizer.sh' || cat "$work/$name.console"
done > "$out/call$call-sanitizer.txt"
cat "$out/call$call-sanitizer.txt"
tar czf "$out/call$call-logs.tgz" -C "$work" .
