// Block- and cluster-wide reductions for the kernels that give a row one block or one cluster.
// Device code only; include from .cu files.
#pragma once

#include <cooperative_groups.h>

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

// The max of v over a cluster of kClusterBlocks blocks of kThreads threads (sm_90), returned to
// every thread: each block's maximum meets the others' through distributed shared memory. Every
// thread of the cluster must call it.
template <int kThreads, int kClusterBlocks>
__device__ inline float cluster_max(float v) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  __shared__ float block_value;
  v = block_max<kThreads>(v);
  if (threadIdx.x == 0) block_value = v;
  cluster.sync();  // every block's maximum is in
#pragma unroll
  for (int b = 0; b < kClusterBlocks; ++b) v = fmaxf(v, *cluster.map_shared_rank(&block_value, b));
  cluster.sync();  // no block leaves while another may still read its maximum
  return v;
}

}  // namespace gpulab::kernels
