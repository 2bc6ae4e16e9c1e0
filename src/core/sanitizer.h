// What a compute-sanitizer run needs from the library: scripts/compute_sanitizer.sh sets
// GPULAB_SANITIZER to the tool it runs (memcheck, racecheck, initcheck, synccheck).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace gpulab::core {

// The tool this process runs under, as GPULAB_SANITIZER names it ("" outside one).
const std::string& sanitizer_tool();
// Whether that tool is racecheck (read once: the training and decode loops ask every layer).
bool under_racecheck();

// initcheck does not see bulk (TMA) stores (scripts/initcheck_bulk_store_probe.cu shows it), and
// cuBLASLt's and cuDNN's sm_90 kernels write their results that way, so initcheck flags every
// later read of such a result although the data is there. Under initcheck only, this zeroes
// `bytes` at `result` on `stream` before a library call writes all of them: initcheck then sees
// them written, and what it reports is about our own kernels. Outside initcheck it does nothing.
void zero_library_result_under_initcheck(void* result, size_t bytes, cudaStream_t stream);

// The libraries also stage partial results in their workspace that way and read them back:
// cuBLASLt's split-K reduction, cuDNN's NCHW engines (their NHWC result, then transposed). Under
// initcheck only, this zeroes a newly allocated workspace (and waits for it): written once, it
// stays written for initcheck. Outside initcheck it does nothing.
void zero_library_workspace_under_initcheck(void* workspace, size_t bytes);

// racecheck holds about 11 MiB of host memory for every launch since the host last waited for the
// GPU, and gives it back only then (scripts/racecheck_launch_memory_probe.cu, session 41): a
// training step of a thousand launches queued behind the last one held tens of GiB, and two such
// runs used up a 128 GiB machine. Under racecheck only, this waits for `stream` (unless it is being
// captured into a graph), so that code which launches many kernels between its own waits calls it
// now and then. Elsewhere it does nothing.
void wait_under_racecheck(cudaStream_t stream);

}  // namespace gpulab::core
