#include "kernels/rmsnorm.h"

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/pdl.h"

namespace gpulab::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kCached = 16;  // elements per thread held in registers between the two passes

// One block per row. Decode normalizes a handful of rows, so a row's loads must all be in
// flight at once: each thread issues its kCached loads of the row and of the weight before using
// any, so the weight's latency hides behind the row's and the reduction's (rows up to
// kThreads · kCached read memory once; longer rows are read again for the output).
template <class Out, class In>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(Out* out, const In* in, const Out* weight, int64_t dim,
                                                           float eps) {
  pdl_launch_dependents();
  pdl_wait();
  const In* x = in + blockIdx.x * dim;
  float v[kCached], w[kCached];
  float sum_sq = 0.f;
#pragma unroll
  for (int j = 0; j < kCached; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kThreads;
    v[j] = i < dim ? static_cast<float>(x[i]) : 0.f;
    w[j] = i < dim ? static_cast<float>(weight[i]) : 0.f;
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
  Out* y = out + blockIdx.x * dim;
#pragma unroll
  for (int j = 0; j < kCached; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kThreads;
    if (i < dim) y[i] = static_cast<Out>(w[j] * (v[j] * inv_rms));
  }
  for (int64_t i = threadIdx.x + int64_t(kCached) * kThreads; i < dim; i += kThreads)
    y[i] = static_cast<Out>(static_cast<float>(weight[i]) * (static_cast<float>(x[i]) * inv_rms));
}

}  // namespace

void rmsnorm(void* out, core::DType out_dtype, const void* in, core::DType in_dtype, const void* weight,
             int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  core::dispatch_activation(out_dtype, [&]<class Out>() {
    core::dispatch_activation(in_dtype, [&]<class In>() {
      launch_overlapped(rmsnorm_kernel<Out, In>, dim3(rows), dim3(kThreads), 0, stream, static_cast<Out*>(out),
                        static_cast<const In*>(in), static_cast<const Out*>(weight), dim, eps);
    });
  });
}

}  // namespace gpulab::kernels
