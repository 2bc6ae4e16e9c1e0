// Synchronised BatchNorm for data parallelism (PyTorch's SyncBatchNorm): every rank normalises
// with the mean and variance of the global batch. NHWC activations are `rows` x `channels`;
// per-channel sums are taken in double, then summed over ranks in place by `sum_over_ranks`, so
// the result equals BatchNorm over one batch of world x rows. Parameters and the saved
// statistics are fp32, as cuDNN's; running variance is unbiased, as cuDNN's and torch's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/dtype.h"

namespace gpulab::train {

using SumOverRanks = std::function<void(double* data, size_t count, cudaStream_t stream)>;

struct SyncBatchNorm {
  core::DType dtype;  // of x, y, dy, dx: f32, f16 or bf16
  int64_t rows;       // on this rank
  int channels;
  int world;          // ranks, each with `rows` rows
  double eps, momentum;
  double* scratch;    // device, 2 x channels
  SumOverRanks sum_over_ranks;
};

// y = gamma (x - mean) inv_std + beta; saves mean and inv_std for backward, updates running stats.
void sync_batchnorm_forward(const SyncBatchNorm& bn, const void* x, void* y, const float* gamma, const float* beta,
                            float* running_mean, float* running_var, float* save_mean, float* save_inv_std,
                            cudaStream_t stream);

// dx from dy; dgamma and dbeta (this rank's sums, written or, with `accumulate`, added) as
// cuDNN's BatchNorm backward, so that averaging them over ranks gives the global batch's.
void sync_batchnorm_backward(const SyncBatchNorm& bn, const void* x, const void* dy, void* dx, const float* gamma,
                             float* dgamma, float* dbeta, bool accumulate, const float* save_mean,
                             const float* save_inv_std, cudaStream_t stream);

}  // namespace gpulab::train
