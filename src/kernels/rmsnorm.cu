#include "kernels/rmsnorm.h"

#include <cuda_fp8.h>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/fp8_quant.h"
#include "kernels/pdl.h"

namespace gpulab::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kCached = 16;  // elements per thread held in registers between the two passes

// One block per row. Decode normalizes a handful of rows, so a row's loads must all be in
// flight at once: each thread issues its kCached loads of the weight (before the wait on the
// kernel before, which writes the row) and of the row before using any (rows up to
// kThreads · kCached read memory once; longer rows are read again for the output). The output
// is rounded to Out; with q given, that row is then quantized to e4m3 with its own scale, as
// fp8_quantize quantizes Out rows per row (its amax over the rounded values, the same division).
template <class Out, class In>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(Out* out, __nv_fp8_storage_t* q, float* scales, const In* in,
                                                           const Out* weight, int64_t dim, float eps) {
  pdl_launch_dependents();
  // The weight is constant (kernels/pdl.h): its loads go out before the wait, the row's after it.
  float v[kCached], w[kCached];
#pragma unroll
  for (int j = 0; j < kCached; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kThreads;
    w[j] = i < dim ? static_cast<float>(weight[i]) : 0.f;
  }
  pdl_wait();
  const In* x = in + blockIdx.x * dim;
  float sum_sq = 0.f;
#pragma unroll
  for (int j = 0; j < kCached; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kThreads;
    v[j] = i < dim ? static_cast<float>(x[i]) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kCached; ++j) sum_sq += v[j] * v[j];
  for (int64_t i = threadIdx.x + int64_t(kCached) * kThreads; i < dim; i += kThreads) {
    const float t = static_cast<float>(x[i]);
    sum_sq += t * t;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  float total = 0.f;
  for (int warp = 0; warp < kThreads / 32; ++warp) total += warp_sums[warp];
  const float inv_rms = rsqrtf(total / static_cast<float>(dim) + eps);
  const auto normed = [&](float weight_i, float x_i) { return static_cast<Out>(weight_i * (x_i * inv_rms)); };
  const auto normed_at = [&](int64_t i) { return normed(static_cast<float>(weight[i]), static_cast<float>(x[i])); };
  const int64_t row = blockIdx.x * dim;
  float scale = 1.f;
  if (q) {
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < kCached; ++j) amax = fmaxf(amax, fabsf(static_cast<float>(normed(w[j], v[j]))));
    for (int64_t i = threadIdx.x + int64_t(kCached) * kThreads; i < dim; i += kThreads)
      amax = fmaxf(amax, fabsf(static_cast<float>(normed_at(i))));
    scale = fp8_scale_for_amax(block_max<kThreads>(amax));
    if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  }
  const auto store = [&](int64_t i, Out value) {
    if (q) q[row + i] = fp8_quantize_value(static_cast<float>(value), scale);
    else out[row + i] = value;
  };
#pragma unroll
  for (int j = 0; j < kCached; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kThreads;
    if (i < dim) store(i, normed(w[j], v[j]));
  }
  for (int64_t i = threadIdx.x + int64_t(kCached) * kThreads; i < dim; i += kThreads) store(i, normed_at(i));
}

template <class Out>
void launch(Out* out, __nv_fp8_storage_t* q, float* scales, const void* in, core::DType in_dtype, const void* weight,
            int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  core::dispatch_activation(in_dtype, [&]<class In>() {
    launch_overlapped(rmsnorm_kernel<Out, In>, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, out, q,
                      scales, static_cast<const In*>(in), static_cast<const Out*>(weight), dim, eps);
  });
}

}  // namespace

void rmsnorm(void* out, core::DType out_dtype, const void* in, core::DType in_dtype, const void* weight,
             int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  core::dispatch_activation(out_dtype, [&]<class Out>() {
    launch(static_cast<Out*>(out), nullptr, nullptr, in, in_dtype, weight, rows, dim, eps, stream);
  });
}

void rmsnorm_fp8(void* out, float* scales, core::DType dtype, const void* in, core::DType in_dtype, const void* weight,
                 int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  core::dispatch_activation(dtype, [&]<class Out>() {
    launch(static_cast<Out*>(nullptr), static_cast<__nv_fp8_storage_t*>(out), scales, in, in_dtype, weight, rows, dim,
           eps, stream);
  });
}

}  // namespace gpulab::kernels
