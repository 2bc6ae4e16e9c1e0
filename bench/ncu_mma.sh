#!/usr/bin/env bash
# Nsight Compute on the GPU machine: one timed launch of each named `gpulab bench gemm` variant
# at one size (default: the mma.sync ladder step and cuBLASLt, bf16, 8192³): text reports and
# .ncu-rep files, packed into one $OUT/ncu_SIZE.tgz (the device tool returns few files), and the
# headline figures on stdout. Run from the repository root after scripts/device.sh has built
# build-device/ (this script builds it with `scripts/device.sh --no-tests` when missing):
#
#   bench/ncu_mma.sh [SIZE [VARIANT ...]]
#   bench/ncu_mma.sh 8192 ladder4_mma_sync_bf16 cublaslt_bf16 ladder5_wgmma_bf16
#
# gpulab brackets the timed launches of each variant with cudaProfilerStart/Stop (verification and
# the fp32 reference stay outside), so `--profile-from-start off --launch-count 1` profiles the
# first timed launch and nothing else. ncu locks the clocks to base (its default), so absolute
# times are below the bench's; compare the kernels with each other.
# Files: ncu_VARIANT_SIZE.txt (the sections below), ncu_VARIANT_SIZE.ncu-rep, ncu_VARIANT_SIZE_raw.txt
# (every metric those sections collected, read back from the report: stall reasons, pipe
# utilisation, shared-memory wavefronts) and ncu_VARIANT_SIZE_metrics.txt (a few counters by name;
# a separate best-effort pass, so a metric name this ncu lacks cannot lose the rest).
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${OUT:-/tmp/gpulab-out}
mkdir -p "$dest"
out=$(mktemp -d)
ncu=${NCU:-/usr/local/cuda/bin/ncu}
size=${1:-8192}
(($#)) && shift
variants=("$@")
((${#variants[@]})) || variants=(ladder4_mma_sync_bf16 cublaslt_bf16)
gpulab=build-device/src/cli/gpulab
if [[ ! -x $gpulab ]]; then
  scripts/device.sh --no-tests || exit 1
fi

sections=(SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables WarpStateStats
          SchedulerStats LaunchStats Occupancy InstructionStats SourceCounters)
known=$("$ncu" --list-sections 2>/dev/null | awk '{print $1}')
section_args=()
for s in "${sections[@]}"; do
  if [[ -z $known ]] || grep -qx "$s" <<<"$known"; then section_args+=(--section "$s"); else echo "ncu has no section $s: skipped"; fi
done
metrics=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum
metrics+=,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,smsp__cycles_active.avg,sm__cycles_elapsed.avg
metrics+=,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
metrics+=,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio

status=0
for v in "${variants[@]}"; do
  name=ncu_${v}_${size}
  echo "== ncu: $v at ${size}³"
  "$ncu" --profile-from-start off --launch-count 1 "${section_args[@]}" --export "$out/$name" --force-overwrite \
    "$gpulab" bench gemm --only "$v" --sizes "$size" >"$out/$name.txt" 2>&1 || status=1
  "$ncu" --import "$out/$name.ncu-rep" --page raw >"$out/${name}_raw.txt" 2>&1
  "$ncu" --profile-from-start off --launch-count 1 --metrics "$metrics" \
    "$gpulab" bench gemm --only "$v" --sizes "$size" >"$out/${name}_metrics.txt" 2>&1
  # The kernel's name and headline figures, so the call's own output already shows the comparison.
  grep -E "^  [A-Za-z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|No kernels were profiled|ERROR" \
    "$out/$name.txt" | head -12
  grep -E "pct_of_peak|stalled|wavefronts|conflicts|ERROR" "$out/${name}_metrics.txt" | head -14
  grep -E "pipe_tensor.*pct_of_peak_sustained_active|smsp__average_warp_latency_issue_stalled_(barrier|short_scoreboard|math_pipe_throttle|long_scoreboard|mio_throttle|wait|not_selected|selected)\.|shared_op_ld.sum |bank_conflicts_pipe_lsu_mem_shared_op_ld.sum " \
    "$out/${name}_raw.txt" | head -20
done
tar czf "$dest/ncu_${size}.tgz" -C "$out" . && rm -rf "$out"
echo "wrote $dest/ncu_${size}.tgz"
exit $status
