#include "bench/gemm_data.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "bench/device_count.cuh"
#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "core/memory.h"

#include <algorithm>

namespace gpulab::bench {

namespace {

__device__ inline uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
__global__ void fill_kernel(T* p, int64_t rows, int64_t cols, bool transposed, uint64_t seed) {
  const int64_t total = rows * cols;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    // idx walks storage order; recover the logical (i, j).
    const int64_t i = transposed ? idx % rows : idx / cols;
    const int64_t j = transposed ? idx / rows : idx % cols;
    const float v = float(int(mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i) * 0x100000001b3ull + uint64_t(j)) % 5) - 2);
    p[idx] = T(v);
  }
}

template <class T>
__global__ void mismatch_kernel(const T* out, const float* ref, uint64_t n, float atol, float rtol,
                                unsigned long long* wrong) {
  unsigned long long local = 0;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const float expect = float(T(ref[i]));  // the reference rounded through the output type
    const float got = float(out[i]);
    // Written so that NaN fails: the comparison is false for NaN.
    if (!(fabsf(got - expect) <= atol + rtol * fabsf(expect)) || isinf(got)) ++local;
  }
  if (local) atomicAdd(wrong, local);
}

}  // namespace

void fill_integer_matrix(core::DType dt, void* p, int64_t rows, int64_t cols, bool transposed, uint64_t seed,
                         cudaStream_t stream) {
  core::dispatch_float(dt, [&]<class T>() {
    fill_kernel<T><<<grid_stride_blocks(rows * cols), kGridStrideThreads, 0, stream>>>(static_cast<T*>(p), rows, cols, transposed, seed);
    GPULAB_CHECK_LAUNCH();
  });
}

uint64_t count_mismatches(core::DType dt, const void* out, const float* ref, uint64_t n, double atol, double rtol,
                          cudaStream_t stream) {
  return count_on_device(stream, [&](unsigned long long* wrong) {
    core::dispatch_float(dt, [&]<class T>() {
      mismatch_kernel<T><<<grid_stride_blocks(n), kGridStrideThreads, 0, stream>>>(static_cast<const T*>(out), ref, n,
                                                                                  float(atol), float(rtol), wrong);
    });
  });
}

}  // namespace gpulab::bench
