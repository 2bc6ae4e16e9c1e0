#include "kernels/silu_mul.h"

#include <cuda_fp8.h>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/fp8_quant.h"
#include "kernels/pdl.h"
#include "kernels/silu.cuh"

namespace gpulab::kernels {

namespace {

template <class T>
__global__ void silu_mul_kernel(T* out, const T* gate_up, int64_t rows, int64_t inter) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t n = rows * inter;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / inter, i = idx % inter;
    out[idx] = silu_times(gate_up[r * 2 * inter + i], gate_up[r * 2 * inter + inter + i]);
  }
}

// A cluster of kClusterBlocks blocks per row: the row's amax over the values silu_mul would
// write, then those values in e4m3, as fp8_quantize quantizes silu_mul's output per row. A
// decode step has a few rows; with one block each, the arithmetic of a whole row (an exp and a
// division per element, 28672 of them at LLaMA-2-70B) on one SM took 17 us. Each block takes a
// slice of the row, and the slices' maxima meet through distributed shared memory. A thread
// requests its pieces of kVec elements (16 bytes where the row allows) of gate and of up, kBatch
// at a time, before it uses any. Its first batch of values (the whole slice up to kBatch ·
// kFp8Threads pieces a block, as at LLaMA's widths) waits in shared memory between the two passes
// (in registers it took 177 of them a thread); later ones are read again (L2-resident: the GEMM
// before wrote them) and computed again.
// Session 19 (H200, 70B fp8 batch 16, ms a step; calls 2 and 3): clusters of 2 / 4 / 8 blocks
// 23.2 / 22.2 / 21.2; blocks of 512 / 1024 threads rather than 256, 21.1 / 21.9 against 20.9.
constexpr int kFp8Threads = 256, kBatch = 4, kClusterBlocks = 8;

template <class T, int kVec>
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kFp8Threads)
    silu_mul_fp8_kernel(__nv_fp8_storage_t* __restrict__ q, float* __restrict__ scales,
                        const T* __restrict__ gate_up, int64_t inter) {
  pdl_launch_dependents();
  pdl_wait();
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int64_t row = blockIdx.x / kClusterBlocks, pieces = inter / kVec;
  const int64_t per_block = (pieces + kClusterBlocks - 1) / kClusterBlocks;
  const int64_t begin = cluster.block_rank() * per_block, end = min(pieces, begin + per_block);
  using In = Pack<T, kVec>;
  const In* gate = reinterpret_cast<const In*>(gate_up + row * 2 * inter);
  const In* up = reinterpret_cast<const In*>(gate_up + row * 2 * inter + inter);
  constexpr int64_t kStride = int64_t(kBatch) * kFp8Threads;  // pieces of the block's batch
  // Calls f(piece index, its silu(g)·u values in T) for every piece of the slice this thread owns
  // from batch p0 on.
  const auto for_each_piece = [&](int64_t p0, auto&& f) {
    for (; p0 < end; p0 += kStride) {
      In g[kBatch], u[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t p = p0 + int64_t(b) * kFp8Threads;
        if (p < end) g[b] = gate[p], u[b] = up[p];
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t p = p0 + int64_t(b) * kFp8Threads;
        if (p >= end) break;
        In v;
#pragma unroll
        for (int e = 0; e < kVec; ++e) v.v[e] = silu_times(g[b].v[e], u[b].v[e]);
        f(p, v);
      }
    }
  };
  // The first batch's values, kept for the second pass: each thread reads back only its own.
  __shared__ In held[kStride];
  const int64_t first = begin + threadIdx.x;
  float amax = 0.f;
  for_each_piece(first, [&](int64_t p, const In& v) {
    if (p - begin < kStride) held[p - begin] = v;
#pragma unroll
    for (int e = 0; e < kVec; ++e) amax = fmaxf(amax, fabsf(static_cast<float>(v.v[e])));
  });
  const float scale = fp8_scale_for_amax(cluster_max<kFp8Threads, kClusterBlocks>(amax));
  if (cluster.block_rank() == 0 && threadIdx.x == 0) scales[row] = scale;
  auto* out = reinterpret_cast<Pack<__nv_fp8_storage_t, kVec>*>(q + row * inter);
  const auto store = [&](int64_t p, const In& v) {
    Pack<__nv_fp8_storage_t, kVec> bytes;
#pragma unroll
    for (int e = 0; e < kVec; ++e) bytes.v[e] = fp8_quantize_value(static_cast<float>(v.v[e]), scale);
    out[p] = bytes;
  };
#pragma unroll
  for (int b = 0; b < kBatch; ++b)
    if (first + b * kFp8Threads < end) store(first + b * kFp8Threads, held[threadIdx.x + b * kFp8Threads]);
  for_each_piece(first + kStride, store);
}

}  // namespace

void silu_mul(void* out, const void* gate_up, int64_t rows, int64_t inter, core::DType dtype, cudaStream_t stream) {
  const int64_t n = rows * inter;
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  core::dispatch_activation(dtype, [&]<class T>() {
    launch_overlapped(silu_mul_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream,
                      static_cast<T*>(out), static_cast<const T*>(gate_up), rows, inter);
  });
}

void silu_mul_fp8(void* out, float* scales, const void* gate_up, int64_t rows, int64_t inter, core::DType dtype,
                  cudaStream_t stream) {
  if (rows == 0 || inter == 0) return;
  core::dispatch_activation(dtype, [&]<class T>() {
    const auto launch = [&]<int kVec>() {
      launch_overlapped(silu_mul_fp8_kernel<T, kVec>, dim3(static_cast<unsigned>(rows * kClusterBlocks)),
                        dim3(kFp8Threads), 0, stream, static_cast<__nv_fp8_storage_t*>(out), scales,
                        static_cast<const T*>(gate_up), inter);
    };
    // gate_up's rows are 2·inter long: where inter makes whole packs, every row's gate and up
    // start on 16 bytes as the first row's gate does.
    if (fp8_rows_pack(gate_up, out, inter, sizeof(T))) return launch.template operator()<kPackOf<T>>();
    launch.template operator()<1>();
  });
}

}  // namespace gpulab::kernels
