// RMSNorm as LLaMA uses it: out = weight · x / sqrt(mean(x²) + eps), per row, math in float32.
// `weight` has the dtype of `out`; `in` may differ (a float32 residual stream into bf16). The
// kernels launch overlapped (kernels/pdl.h) and read `weight` before they wait on the kernel
// before them: it must be constant, as model weights are.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

void rmsnorm(void* out, core::DType out_dtype, const void* in, core::DType in_dtype, const void* weight,
             int64_t rows, int64_t dim, float eps, cudaStream_t stream);

// rmsnorm into `dtype` (bf16/fp16: the weight's dtype and the rounding), then quantized to e4m3
// per row into out [rows, dim] and scales [rows], bit for bit as fp8_quantize(Fp8Granularity::row)
// quantizes rmsnorm's output: the input of a W8A8 linear layer in one kernel instead of two.
void rmsnorm_fp8(void* out, float* scales, core::DType dtype, const void* in, core::DType in_dtype, const void* weight,
                 int64_t rows, int64_t dim, float eps, cudaStream_t stream);

void rmsnorm_ref(float* out, const float* in, const float* weight, int64_t rows, int64_t dim, float eps);

}  // namespace gpulab::kernels
