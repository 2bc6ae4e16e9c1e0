// Block-wide reductions for the kernels that give a row one block. Device code only; include
// from .cu files.
#pragma once

namespace gpulab::kernels {

// The max of v over a block of kThreads threads, returned to every thread. Every thread of the
// block must call it.
template <int kThreads>
__device__ inline float block_max(float v) {
  __shared__ float warp_max[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_max[0];
  for (int w = 1; w < kThreads / 32; ++w) v = fmaxf(v, warp_max[w]);
  __syncthreads();  // warp_max may be reused by a following call
  return v;
}

}  // namespace gpulab::kernels
