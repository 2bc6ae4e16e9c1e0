// RMSNorm as LLaMA uses it: out = weight · x / sqrt(mean(x²) + eps), per row, math in float32.
// `weight` has the dtype of `out`; `in` may differ (a float32 residual stream into bf16).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

void rmsnorm(void* out, core::DType out_dtype, const void* in, core::DType in_dtype, const void* weight,
             int64_t rows, int64_t dim, float eps, cudaStream_t stream);

void rmsnorm_ref(float* out, const float* in, const float* weight, int64_t rows, int64_t dim, float eps);

}  // namespace gpulab::kernels
