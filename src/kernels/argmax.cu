#include "kernels/argmax.h"

#include <climits>

#include "core/dtype_dispatch.h"
#include "core/error.h"

namespace gpulab::kernels {

namespace {

constexpr int kThreads = 256;

// Keeps the larger value, the smaller index on ties.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

template <class T>
__global__ void argmax_kernel(int32_t* out, const T* x, int64_t cols) {
  const T* row = x + blockIdx.x * cols;
  float best = -INFINITY;
  int index = INT_MAX;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) better(best, index, static_cast<float>(row[c]), static_cast<int>(c));
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
    argmax_kernel<T><<<rows, kThreads, 0, stream>>>(out, static_cast<const T*>(x), cols);
    GPULAB_CHECK_LAUNCH();
  });
}

}  // namespace gpulab::kernels
