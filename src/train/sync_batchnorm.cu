#include "train/sync_batchnorm.h"

#include <algorithm>

#include "core/dtype_dispatch.h"
#include "core/error.h"

namespace gpulab::train {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 128;  // rows summed in float before one double atomic per channel

unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }
unsigned elementwise_blocks(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8)); }

// sums[c] += Σ a(r, c), sums[C + c] += Σ b(r, c) over this block's rows; a and b come from `f`.
template <class F>
__device__ void channel_sums(int64_t rows, int channels, double* sums, F f) {
  const int64_t r0 = int64_t(blockIdx.x) * kRowsPerBlock, r1 = min(rows, r0 + kRowsPerBlock);
  for (int c = threadIdx.x; c < channels; c += blockDim.x) {
    float a = 0.f, b = 0.f;
    for (int64_t r = r0; r < r1; ++r) f(r * channels + c, c, a, b);
    atomicAdd(&sums[c], double(a));
    atomicAdd(&sums[channels + c], double(b));
  }
}

template <class T>
__global__ void forward_sums_kernel(const T* x, int64_t rows, int channels, double* sums) {
  channel_sums(rows, channels, sums, [&](int64_t i, int, float& a, float& b) {
    const float v = float(x[i]);
    a += v;
    b += v * v;
  });
}

__global__ void finalize_kernel(const double* sums, int channels, double count, double eps, double momentum,
                                float* save_mean, float* save_inv_std, float* running_mean, float* running_var) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const double mean = sums[c] / count, var = fmax(sums[channels + c] / count - mean * mean, 0.0);
  save_mean[c] = float(mean);
  save_inv_std[c] = float(1.0 / sqrt(var + eps));
  running_mean[c] = float((1 - momentum) * running_mean[c] + momentum * mean);
  running_var[c] = float((1 - momentum) * running_var[c] + momentum * var * count / fmax(count - 1, 1.0));
}

template <class T>
__global__ void forward_apply_kernel(const T* x, T* y, const float* mean, const float* inv_std, const float* gamma,
                                     const float* beta, int64_t n, int channels) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % channels);
    y[i] = T((float(x[i]) - mean[c]) * inv_std[c] * gamma[c] + beta[c]);
  }
}

template <class T>
__global__ void backward_sums_kernel(const T* x, const T* dy, const float* mean, const float* inv_std, int64_t rows,
                                     int channels, double* sums) {
  channel_sums(rows, channels, sums, [&](int64_t i, int c, float& a, float& b) {
    const float g = float(dy[i]);
    a += g;
    b += g * (float(x[i]) - mean[c]) * inv_std[c];
  });
}

__global__ void param_grads_kernel(const double* sums, int channels, float* dgamma, float* dbeta, int accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  dbeta[c] = (accumulate ? dbeta[c] : 0.f) + float(sums[c]);
  dgamma[c] = (accumulate ? dgamma[c] : 0.f) + float(sums[channels + c]);
}

template <class T>
__global__ void backward_apply_kernel(const T* x, const T* dy, T* dx, const float* mean, const float* inv_std,
                                      const float* gamma, const double* sums, double count, int64_t n, int channels) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % channels);
    const float xhat = (float(x[i]) - mean[c]) * inv_std[c];
    const float mean_dy = float(sums[c] / count), mean_dy_xhat = float(sums[channels + c] / count);
    dx[i] = T(gamma[c] * inv_std[c] * (float(dy[i]) - mean_dy - xhat * mean_dy_xhat));
  }
}

void check(const SyncBatchNorm& bn) {
  if (bn.rows < 1 || bn.channels < 1 || bn.world < 1 || !bn.scratch || !bn.sum_over_ranks)
    throw core::Error("sync batchnorm: empty shape, no scratch or no reduction");
}

}  // namespace

void sync_batchnorm_forward(const SyncBatchNorm& bn, const void* x, void* y, const float* gamma, const float* beta,
                            float* running_mean, float* running_var, float* save_mean, float* save_inv_std,
                            cudaStream_t stream) {
  check(bn);
  const int C = bn.channels;
  GPULAB_CHECK(cudaMemsetAsync(bn.scratch, 0, 2 * size_t(C) * sizeof(double), stream));
  core::dispatch_activation(bn.dtype, [&]<class T>() {
    forward_sums_kernel<T><<<row_blocks(bn.rows), kThreads, 0, stream>>>(static_cast<const T*>(x), bn.rows, C, bn.scratch);
  });
  GPULAB_CHECK_LAUNCH();
  bn.sum_over_ranks(bn.scratch, 2 * size_t(C), stream);
  finalize_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      bn.scratch, C, double(bn.rows) * bn.world, bn.eps, bn.momentum, save_mean, save_inv_std, running_mean, running_var);
  GPULAB_CHECK_LAUNCH();
  const int64_t n = bn.rows * C;
  core::dispatch_activation(bn.dtype, [&]<class T>() {
    forward_apply_kernel<T><<<elementwise_blocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), save_mean, save_inv_std, gamma, beta, n, C);
  });
  GPULAB_CHECK_LAUNCH();
}

void sync_batchnorm_backward(const SyncBatchNorm& bn, const void* x, const void* dy, void* dx, const float* gamma,
                             float* dgamma, float* dbeta, bool accumulate, const float* save_mean,
                             const float* save_inv_std, cudaStream_t stream) {
  check(bn);
  const int C = bn.channels;
  GPULAB_CHECK(cudaMemsetAsync(bn.scratch, 0, 2 * size_t(C) * sizeof(double), stream));
  core::dispatch_activation(bn.dtype, [&]<class T>() {
    backward_sums_kernel<T><<<row_blocks(bn.rows), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), save_mean, save_inv_std, bn.rows, C, bn.scratch);
  });
  GPULAB_CHECK_LAUNCH();
  // The parameter gradients are this rank's sums: data parallelism averages them like any other.
  param_grads_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(bn.scratch, C, dgamma, dbeta, accumulate);
  GPULAB_CHECK_LAUNCH();
  bn.sum_over_ranks(bn.scratch, 2 * size_t(C), stream);
  const int64_t n = bn.rows * C;
  core::dispatch_activation(bn.dtype, [&]<class T>() {
    backward_apply_kernel<T><<<elementwise_blocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), save_mean, save_inv_std, gamma,
        bn.scratch, double(bn.rows) * bn.world, n, C);
  });
  GPULAB_CHECK_LAUNCH();
}

}  // namespace gpulab::train
