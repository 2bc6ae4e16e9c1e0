#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck, racecheck, initcheck and synccheck over every `gpu` test (the
# tests `ctest -L gpu` runs) on a machine with a GPU, one run per test and tool, several at once,
# and prints a summary table.
#   scripts/compute_sanitizer.sh [--build DIR] [--tools "memcheck racecheck initcheck synccheck"]
#                                [--only TEST_REGEX] [--exclude TEST_REGEX] [--jobs N]
#                                [--timeout S] [--deadline S] [--shortest-first RESULTS_DIR]
#                                [--left RESULTS_DIR] [--leak-check] [--library-kernels]
# Each test runs alone (`exe --gtest_filter=Suite.Name`), so a slow test costs only its own run and
# a timeout names the test. Runs are spread round-robin over the GPUs (those CUDA_VISIBLE_DEVICES
# lists, else all), each run seeing one; a test that skips there (it needs several GPUs) runs
# again seeing them all. CUDA API calls that return an error are not counted: NCCL probes with
# calls that fail by design (cudaFuncGetAttributes on kernels built for other GPUs, cuMemCreate
# where the VMM handle type is not permitted: 75 such reports in session 6), and every error
# our own code gets back fails its test through GPULAB_CHECK.
# Logs go to $OUT/compute-sanitizer/ (or DIR/compute-sanitizer/); summary.txt has one line per run:
# test, tool, exit status, seconds, errors (a test that skipped, failed, or gave no verdict says so:
# the tool's exit status 99 hides the program's). Exit 1 when any run
# reports an error or fails; timeouts (124) and runs where the sanitizer itself failed or checked
# nothing (125: "Internal Sanitizer Error", as when runs beside it took the GPU's memory, or "No
# attachable process found", a program with no CUDA call) are listed, not judged.
# --deadline S ends the whole pass S seconds after it starts (a device call's own limit): a run
# still going then ends as a timeout, and the runs not started by then are listed as not run.
# --shortest-first DIR (with a deadline, more runs finish): runs start in the order of their last
# recorded seconds in DIR's *sanitizer*.txt summaries (bench/results), the same tool's else
# memcheck's, 120 s when neither ran; ties keep ctest's order.
# --left DIR runs only the (test, tool) pairs without a clean or racecheck "library only" run on
# record in DIR's summaries (scripts/sanitizer_coverage.py's rules), so a device session spends its
# time on what is left.
# Both may be given more than once (bench/results and the session's own earlier summaries).
# Runs share each GPU: the engine tests size their KV pools from free memory, so keep --jobs at
# about 2 per GPU (session 7: 6 runs on one GPU failed 45 tests with out-of-memory). They share the
# host's memory too: racecheck holds about 11 MiB for each launch until the host waits for the GPU
# (scripts/racecheck_launch_memory_probe.cu), so one training test took up to 122.6 GiB of a 128 GiB
# machine (sessions 36-41) until the ResNet waited at each layer under it (core::wait_under_racecheck:
# three at once then used 9 GiB, session 41). Other code that launches long runs between waits may
# still want --jobs 1, as may tests whose library kernels race: each such kernel's hazard records
# stay until the program ends (session 43: 12-15 GiB for a racy probe kernel or one cuBLAS GEMM).
# Each summary line gives a run's host memory peak from 0.5 GiB (not of a run the timeout ended).
# synccheck leaves the libraries' kernels (NCCL, cuDNN, cuBLAS, nvJPEG) out unless
# --library-kernels: NCCL's ring kernels reach barriers from divergent threads by design
# (session 10: 7,000-17,000 reports a multi-GPU test), which would hide one of ours; they still
# run. The other tools check every kernel: initcheck would take an excluded kernel's stores for
# never written, and racecheck with a kernel filter failed with "Internal Sanitizer Error" on the
# engine tests (sessions 8 and 10). The pseudo-tool racecheck-ours is racecheck with those kernels
# left out all the same, for the tests whose full racecheck outlasts a device call: under it cuDNN's
# kernels made a ResNet training step take 50-165 s (session 43), and every hazard it found in them
# is in NVIDIA's code. It checks every kernel of ours (no name of ours matches library_kernel_names,
# below); its summary lines name it, and scripts/sanitizer_coverage.py counts its clean runs apart
# from racecheck's. It ran on 5 of the 19 one-GPU training tests (session 44); on the other 14, in
# two calls alike, the run ended within 2-48 s on an illegal address, all but one run saying "The
# Sanitizer failed to handle a hardware exception", as 42 filtered runs did in session 10. On one
# of them excluding cuDNN's kernels alone, or cuBLAS's, did the same; excluding only kernels it
# never launches (NCCL's, nvJPEG's) did not, memcheck with cuDNN's excluded passed, and its full
# racecheck runs went 368-420 s without it: the fault is racecheck's with a kernel filter, not the
# test's. initcheck's library reports are read apart instead: NCCL's flags, cuDNN's
# implicit-GEMM padding and nvJPEG's conversion of a corrupt image (session 10).
# initcheck does not see bulk (TMA) stores nor the JPEG hardware engine's writes (session 27). So
# under it the library zeroes what cuBLASLt and cuDNN are about to write and, once, their
# workspaces (core/sanitizer.h), and nvJPEG runs without its hardware engine (GPULAB_NVJPEG_HARDWARE=0).
# Notes: the diagnose tests inject CUPTI into their child programs; compute-sanitizer also hooks
# the CUDA driver, so test_trace_gpu results are only meaningful for tests that do not trace.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build-device tools="memcheck racecheck initcheck synccheck" only="" exclude="" jobs=4 timeout_s=600 leak_check=0
library_kernels=0 deadline=0 shortest_first="" left=""
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --tools) tools=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --exclude) exclude=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --shortest-first) shortest_first+=${shortest_first:+:}$2; shift 2 ;;  # ':'-joined when repeated
    --left) left+=${left:+:}$2; shift 2 ;;
    --leak-check) leak_check=1; shift ;;  # memcheck also reports device memory never freed
    --library-kernels) library_kernels=1; shift ;;
    *) echo "compute_sanitizer.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[[ -x $sanitizer ]] || { echo "compute_sanitizer.sh: compute-sanitizer not found" >&2; exit 1; }
[[ -d $build ]] || { echo "compute_sanitizer.sh: no build in $build (scripts/device.sh --no-tests builds one)" >&2; exit 1; }
out=${OUT:-$build}/compute-sanitizer
mkdir -p "$out"
# The GPUs to spread runs over: CUDA_VISIBLE_DEVICES's list when set, else every GPU.
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
device_list=${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((gpus > 0 ? gpus - 1 : 0)))}

# One line per (test, tool): "exe test tool".
runs=$out/runs.txt
ctest --test-dir "$build" -L gpu --show-only=json-v1 | python3 -c '
import json, re, sys
sys.path.insert(0, "scripts")
from sanitizer_coverage import OURS_ONLY, clean_runs, last_seconds, library_only_runs
only, exclude, tools = sys.argv[1], sys.argv[2], sys.argv[3].split()
order_by, left = (sys.argv[i].split(":") if sys.argv[i] else [] for i in (4, 5))
# A "library only" racecheck pair would find the same reports in the same kernels again, and a
# racecheck-ours run is not wanted where racecheck itself ran clean or found the libraries only.
clean = clean_runs(left) | library_only_runs(left) if left else set()
clean |= {(test, OURS_ONLY) for test, tool in clean if tool == "racecheck"}
runs = []
for t in json.load(sys.stdin)["tests"]:
    cmd = t.get("command") or []
    name = next((a.split("=", 1)[1] for a in cmd if a.startswith("--gtest_filter=")), None)
    if not name or (only and not re.search(only, name)) or (exclude and re.search(exclude, name)):
        continue
    runs += [(cmd[0], name, tool) for tool in tools if (name, tool) not in clean]
if order_by:
    seconds = last_seconds(order_by)
    runs.sort(key=lambda r: seconds.get((r[1], r[2]), seconds.get((r[1], "memcheck"), 120)))
for run in runs:
    print(*run)
' "$only" "$exclude" "$tools" "$shortest_first" "$left" > "$runs"
if ! (($(wc -l < "$runs"))); then
  [[ -n $left ]] && { echo "compute_sanitizer.sh: every selected (test, tool) pair has a clean run on record"; exit 0; }
  echo "compute_sanitizer.sh: no gpu tests selected in $build" >&2
  exit 1
fi

# Who ran each report printed in log $1: the first host frame outside the CUDA driver and
# runtime is in a library (cuDNN, cuBLAS, nvJPEG, NCCL) or in our code. racecheck prints no host
# frames: a report whose kernel is a library's by name (library_kernel_names; none of ours matches)
# counts as the library's. Prints "" when nothing was printed, else " [printed: N ours, M libraries,
# K without a host frame]". A library's reads of its own outputs are often the tools' blind spots
# (docs/reliability.md: bulk stores, the JPEG engine); a report in our code is read first.
# The first line of a printed report, whichever the tool ("Error: process didn't terminate" is none).
report_start='^========= (Uninitialized|Invalid|Error: Race|Barrier|Race|Program hit|Host API)'
library_kernel_names='nccl|cudnn|xmma|cublas|nvjet|nvjpeg'
launched_by() {
  awk -v start="$report_start" -v library="$library_kernel_names" '
    function close_report() { if (open && !seen) { if (library_kernel) lib++; else bare++ } open = 0 }
    $0 ~ start { close_report(); open = 1; seen = 0; library_kernel = 0 }
    open && !seen && !/Host Frame:/ && $0 ~ library { library_kernel = 1 }  # the report line or its "at" line
    open && !seen && /Host Frame:/ && !/ in libcuda\.so| in libcudart/ {
      seen = 1
      if (/ in lib(cudnn|cublas|nvjpeg|nccl)/) lib++; else ours++
    }
    END {
      close_report()
      if (ours + lib + bare) printf " [printed: %d ours, %d libraries, %d without a host frame]", ours, lib, bare
    }' "$1"
}

# One run: prints its summary line.
run_one() {
  local exe=$1 test=$2 tool=$3 index=$4
  local log=$out/${test//\//_}.$tool.log  # parameterized names hold '/'
  # --print-limit: every report of the largest runs so far (racecheck: 356 in the 7B GEMM table),
  # so that each run's reports can all be attributed (launched_by), not only the first 50.
  local check=${tool%-ours}  # the tool compute-sanitizer runs: racecheck-ours is racecheck
  local args=(--tool "$check" --error-exitcode 99 --print-limit 1000 --target-processes all --report-api-errors no)
  [[ $tool == memcheck && $leak_check == 1 ]] && args+=(--leak-check full)
  [[ ($tool == synccheck && $library_kernels == 0) || $tool == racecheck-ours ]] &&
    args+=(--kernel-name-exclude "regex=$library_kernel_names")
  local start=$(date +%s) code errors note limit=$timeout_s
  if ((deadline_at)); then
    if ((start >= deadline_at)); then
      printf '%-72s %-14s %5s %6s  %s\n' "$test" "$tool" - 0 "not run (--deadline)"
      return
    fi
    ((deadline_at - start < limit)) && limit=$((deadline_at - start))
  fi
  local devices
  IFS=, read -ra devices <<< "$device_list"
  export CUDA_VISIBLE_DEVICES=${devices[index % ${#devices[@]}]}
  # The sanitizers slow every kernel: the script's --timeout ends a stuck run, not gpulab's stall timeout.
  export GPULAB_STALL_TIMEOUT=${GPULAB_STALL_TIMEOUT:-0}
  # gpulab and its tests read it (src/core/sanitizer.h): timing claims are not judged under a
  # sanitizer, and initcheck gets library results zeroed first.
  export GPULAB_SANITIZER=$check
  # initcheck does not see what the JPEG hardware engine writes (session 27); racecheck checks
  # shared memory, which the engine does not use, and stopped three times with "Internal Sanitizer
  # Error" in a loader test that decodes on it (sessions 24, 33, 34). Under those two nvJPEG decodes
  # on its GPU-hybrid backend, whose kernels they see; memcheck and synccheck check the engine's path.
  [[ $check == initcheck || $check == racecheck ]] && export GPULAB_NVJPEG_HARDWARE=0
  # The log ends with the peak resident memory of the run's largest process (the tool or a program
  # it checks): two racecheck runs of the training tests at once took all 125 GiB of an H100
  # machine's host memory, and one ended mid-test (session 36).
  sanitize() {
    python3 - "$log" "$(dirname "$exe")" \
      timeout "$limit" "$sanitizer" "${args[@]}" "$exe" --gtest_filter="$test" <<'EOF'
import resource, subprocess, sys
log, cwd, command = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(log, "w") as out:
    code = subprocess.call(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"compute_sanitizer.sh: peak resident memory of the largest process: {peak_kib} KiB", file=out)
sys.exit(code if code >= 0 else 128 - code)  # a signal as the shell reports it
EOF
  }
  sanitize
  code=$?
  if grep -q '\[  SKIPPED \]' "$log" && ((${#devices[@]} > 1)); then
    export CUDA_VISIBLE_DEVICES=$device_list
    sanitize
    code=$?
  fi
  # memcheck, initcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck with
  # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)", singular for one ("1 hazard
  # displayed (1 error, ..."), which the table counted as 0 before session 29.
  errors=$(grep -hoE 'ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ error' "$log" |
    grep -oE '[0-9]+ error' | awk '{s += $1} END {print s + 0}')
  note=$errors
  # A run cut short prints no summary: count the reports it printed before (at most --print-limit),
  # which session 25 found in training runs that a 0 here had hidden.
  if ((code == 124)); then
    errors=$(grep -cE "$report_start" "$log")
    note="$errors printed (timed out)"
  fi
  grep -q '\[  SKIPPED \]' "$log" && note="$errors (skipped)"
  # The sanitizer itself ran out of GPU memory (runs beside it took it): launches went unchecked
  # and the run says nothing about the test, so it is marked and not judged.
  grep -q 'Internal Sanitizer Error' "$log" && code=125 note="$errors (sanitizer internal error: not judged)"
  # No process made a CUDA call within the tool's --launch-timeout (10 s): it checked nothing and
  # exits 255 whatever the test did (session 40: a test of CPU code only). Not judged either.
  grep -q 'No attachable process found' "$log" && code=125 note="$errors (no CUDA call to check: not judged)"
  note+=$(launched_by "$log")
  # gtest's verdict, which the tool's exit status (99 once it reported anything) hides. A program
  # that ended mid-test prints none: racecheck runs several at once ended so in sessions 35-36, with
  # no message and exit status 9, or 99 where hazards had been reported, when host memory ran out.
  if grep -q '^\[  FAILED  \]' "$log"; then
    note+=" (test failed)"
  elif ((code != 124 && code != 125)) && ! grep -qE '^\[  (PASSED  |SKIPPED )\]' "$log"; then
    note+=" (no test verdict: ended mid-test)"
  fi
  # Host memory, where it is enough to plan --jobs by (from 0.5 GiB).
  note+=$(awk '/^compute_sanitizer.sh: peak resident memory/ {kib = $(NF - 1)}
               END {if (kib >= 512 * 1024) printf " (host memory peak %.1f GiB)", kib / 1024 / 1024}' "$log")
  printf '%-72s %-14s %5s %6s  %s\n' "$test" "$tool" "$code" "$(($(date +%s) - start))" "$note"
}
export -f run_one launched_by
deadline_at=$((deadline > 0 ? $(date +%s) + deadline : 0))
export out sanitizer timeout_s deadline_at leak_check library_kernels device_list report_start library_kernel_names

summary=$out/summary.txt
printf '%-72s %-14s %5s %6s  %s\n' test tool exit sec errors | tee "$summary"
awk '{print $0, NR}' "$runs" | xargs -P "$jobs" -L 1 bash -c 'run_one "$@"' _ | tee -a "$summary"
status=$(awk 'NR > 1 && $3 != "-" && $3 != 124 && $3 != 125 && ($3 != 0 || $5 != 0) {bad = 1} END {print bad + 0}' "$summary")
awk 'NR > 1 {n++; if ($3 == "-") r++; else if ($3 == 124) t++; else if ($3 == 125) u++; else if ($3 != 0 || $5 != 0) f++}
     END {printf "compute_sanitizer.sh: %d runs, %d with errors or failures, %d timed out, %d not judged, %d not run\n",
          n, f, t, u, r}' "$summary"
echo "compute_sanitizer.sh: logs and summary in $out"
exit "$status"
