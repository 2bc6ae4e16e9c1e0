// Launch helpers the kernels share: the SM count for grid sizing, and programmatic dependent
// launch (sm_90): a kernel launched with launch_overlapped may start its
// blocks while the kernel before it on the stream is still running, once that one has called
// pdl_launch_dependents (or at its end if it never does). The early start hides the launch
// and ramp-up between the short kernels of a decode step. The rule that keeps it correct: a
// kernel so launched calls pdl_wait before it reads what an earlier kernel writes or writes what
// an earlier kernel touches (the wait returns once the kernel before has finished and its writes
// show), and every block reaches it, early exits included, so the waits chain back through every
// kernel before. Only constant data (weights) may be read before the wait.
// GPULAB_PDL=0 launches them plainly instead (the wait is then a no-op), for an A/B.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "core/env.h"
#include "core/error.h"

namespace gpulab::kernels {

#ifdef __CUDACC__
__device__ inline void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ inline void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
#endif

// The current GPU's SM count, for sizing grids.
inline int current_sm_count() {
  int device = 0, sms = 0;
  GPULAB_CHECK(cudaGetDevice(&device));
  GPULAB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

template <class... Params, class... Args>
void launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  static const bool enabled = core::env_switch("GPULAB_PDL").value_or(true);
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &overlap;
  config.numAttrs = enabled ? 1 : 0;
  GPULAB_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(std::forward<Args>(args))...));
}

}  // namespace gpulab::kernels
