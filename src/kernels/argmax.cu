#include "kernels/argmax.h"

#include <climits>
#include <cstdint>
#include <cstring>

#include "core/dtype_dispatch.h"
#include "core/error.h"

namespace gpulab::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kInFlight = 8;  // 16-byte loads a thread issues before comparing any

// Keeps the larger value, the smaller index on ties.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One block a row. A decode step has few rows (one at batch 1), so a row's block must not wait
// out one load's latency per element: `packed` rows (16-byte aligned, whole 16-byte pieces)
// are read kInFlight pieces a thread at a time.
template <class T, bool packed>
__global__ void __launch_bounds__(kThreads) argmax_kernel(int32_t* out, const T* x, int64_t cols) {
  const T* row = x + blockIdx.x * cols;
  float best = -INFINITY;
  int index = INT_MAX;
  if constexpr (packed) {
    constexpr int E = 16 / sizeof(T);  // elements in a piece
    const int64_t pieces = cols / E;
    const uint4* p = reinterpret_cast<const uint4*>(row);
    for (int64_t first = threadIdx.x; first < pieces; first += kInFlight * kThreads) {
      uint4 v[kInFlight];
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        const int64_t i = first + j * kThreads;
        if (i < pieces) v[j] = p[i];
      }
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        const int64_t i = first + j * kThreads;
        if (i >= pieces) break;
        T e[E];
        memcpy(e, &v[j], 16);
#pragma unroll
        for (int k = 0; k < E; ++k) better(best, index, static_cast<float>(e[k]), static_cast<int>(i * E + k));
      }
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) better(best, index, static_cast<float>(row[c]), static_cast<int>(c));
  }
  for (int offset = 16; offset > 0; offset /= 2)
    better(best, index, __shfl_xor_sync(0xffffffffu, best, offset), __shfl_xor_sync(0xffffffffu, index, offset));
  __shared__ float values[kThreads / 32];
  __shared__ int indices[kThreads / 32];
  if (threadIdx.x % 32 == 0) {
    values[threadIdx.x / 32] = best;
    indices[threadIdx.x / 32] = index;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) better(best, index, values[w], indices[w]);
    // An all-NaN row has no winner; answer 0 rather than an out-of-range id.
    out[blockIdx.x] = index == INT_MAX ? 0 : index;
  }
}

}  // namespace

void argmax(int32_t* out, const void* x, int64_t rows, int64_t cols, core::DType dtype, cudaStream_t stream) {
  if (rows == 0) return;
  core::dispatch_activation(dtype, [&]<class T>() {
    const bool packed = reinterpret_cast<uintptr_t>(x) % 16 == 0 && cols * sizeof(T) % 16 == 0;
    if (packed) argmax_kernel<T, true><<<rows, kThreads, 0, stream>>>(out, static_cast<const T*>(x), cols);
    else argmax_kernel<T, false><<<rows, kThreads, 0, stream>>>(out, static_cast<const T*>(x), cols);
    GPULAB_CHECK_LAUNCH();
  });
}

}  // namespace gpulab::kernels
