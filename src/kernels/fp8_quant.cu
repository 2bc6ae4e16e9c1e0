#include <cuda_fp8.h>

#include <algorithm>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/fp8_quant.h"

namespace gpulab::kernels {

namespace {

constexpr int kThreads = 256;

// The max of v over the block, returned to every thread.
__device__ float block_max(float v) {
  __shared__ float warp_max[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_max[0];
  for (int w = 1; w < kThreads / 32; ++w) v = fmaxf(v, warp_max[w]);
  __syncthreads();  // warp_max may be reused by a following call
  return v;
}

template <class T>
__device__ float row_abs_max(const T* row, int64_t cols) {
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) m = fmaxf(m, fabsf(static_cast<float>(row[c])));
  return block_max(m);
}

// One block per row.
template <class T>
__global__ void row_amax_kernel(float* row_amax, const T* in, int64_t cols) {
  const float m = row_abs_max(in + blockIdx.x * cols, cols);
  if (threadIdx.x == 0) row_amax[blockIdx.x] = m;
}

// One block per row: the amax is the row's own, or (row_amax given) the max over all rows.
template <class T>
__global__ void quantize_kernel(__nv_fp8_storage_t* out, float* scales, const T* in, int64_t rows, int64_t cols,
                                const float* row_amax) {
  const int64_t r = blockIdx.x;
  const T* row = in + r * cols;
  float m = 0.0f;
  if (row_amax) {
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) m = fmaxf(m, row_amax[i]);
    m = block_max(m);
  } else {
    m = row_abs_max(row, cols);
  }
  const float s = fp8_scale_for_amax(m);
  for (int64_t c = threadIdx.x; c < cols; c += kThreads)
    out[r * cols + c] = __nv_cvt_float_to_fp8(static_cast<float>(row[c]) / s, __NV_SATFINITE, __NV_E4M3);
  if (threadIdx.x == 0) scales[r] = s;
}

template <class T>
__global__ void accumulate_kernel(float* x, const T* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += static_cast<float>(y[i]);
}

}  // namespace

void fp8_quantize(void* out, float* scales, const void* in, core::DType in_dtype, int64_t rows, int64_t cols,
                  Fp8Granularity granularity, float* row_amax, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const bool tensor = granularity == Fp8Granularity::tensor;
  if (tensor && !row_amax) throw core::Error("fp8_quantize: tensor granularity needs a row_amax workspace");
  core::dispatch_activation(in_dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(in);
    if (tensor) {
      row_amax_kernel<T><<<rows, kThreads, 0, stream>>>(row_amax, x, cols);
      GPULAB_CHECK_LAUNCH();
    }
    quantize_kernel<T><<<rows, kThreads, 0, stream>>>(static_cast<__nv_fp8_storage_t*>(out), scales, x, rows, cols,
                                                      tensor ? row_amax : nullptr);
    GPULAB_CHECK_LAUNCH();
  });
}

void accumulate(float* x, const void* y, core::DType y_dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  core::dispatch_activation(y_dtype, [&]<class T>() {
    accumulate_kernel<T><<<blocks, 256, 0, stream>>>(x, static_cast<const T*>(y), n);
    GPULAB_CHECK_LAUNCH();
  });
}

}  // namespace gpulab::kernels
