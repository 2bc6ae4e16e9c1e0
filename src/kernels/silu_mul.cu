#include "kernels/silu_mul.h"

#include <cuda_fp8.h>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/fp8_quant.h"
#include "kernels/pdl.h"

namespace gpulab::kernels {

namespace {

// silu(g) · u rounded to T: the value both kernels write (or quantize).
template <class T>
__device__ inline T silu_times(T g, T u) {
  const float gf = static_cast<float>(g);
  return static_cast<T>(gf / (1.0f + expf(-gf)) * static_cast<float>(u));
}

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
// at a time, before it uses any; the slice (L2-resident: the GEMM before wrote it) is read twice
// rather than held.
constexpr int kFp8Threads = 256, kBatch = 4, kClusterBlocks = 8;

template <class E, int N>
struct alignas(sizeof(E) * N) Piece {
  E e[N];
};

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
  using In = Piece<T, kVec>;
  const In* gate = reinterpret_cast<const In*>(gate_up + row * 2 * inter);
  const In* up = reinterpret_cast<const In*>(gate_up + row * 2 * inter + inter);
  // Calls f(piece index, its silu(g)·u values) for every piece of the slice this thread owns.
  const auto for_each_piece = [&](auto&& f) {
    for (int64_t p0 = begin + threadIdx.x; p0 < end; p0 += int64_t(kBatch) * kFp8Threads) {
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
        float v[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[e] = static_cast<float>(silu_times(g[b].e[e], u[b].e[e]));
        f(p, v);
      }
    }
  };
  float amax = 0.f;
  for_each_piece([&](int64_t, const float(&v)[kVec]) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) amax = fmaxf(amax, fabsf(v[e]));
  });
  const float scale = fp8_scale_for_amax(cluster_max<kFp8Threads, kClusterBlocks>(amax));
  if (cluster.block_rank() == 0 && threadIdx.x == 0) scales[row] = scale;
  auto* out = reinterpret_cast<Piece<__nv_fp8_storage_t, kVec>*>(q + row * inter);
  for_each_piece([&](int64_t p, const float(&v)[kVec]) {
    Piece<__nv_fp8_storage_t, kVec> bytes;
#pragma unroll
    for (int e = 0; e < kVec; ++e) bytes.e[e] = fp8_quantize_value(v[e], scale);
    out[p] = bytes;
  });
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
    // 16-byte pieces where every row's gate, up and output start on 16 bytes.
    constexpr int kVec16 = 16 / sizeof(T);
    const bool whole_pieces = inter % 16 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                              reinterpret_cast<uintptr_t>(out) % 16 == 0;
    if (whole_pieces) return launch.template operator()<kVec16>();
    launch.template operator()<1>();
  });
}

}  // namespace gpulab::kernels
