// Adds a bias row to every row: x[r, i] += bias[i] (Qwen2's q/k/v biases, Llama attention_bias),
// math in float32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

void bias_add(void* x, const void* bias, int64_t rows, int64_t cols, core::DType dtype, cudaStream_t stream);

void bias_add_ref(float* x, const float* bias, int64_t rows, int64_t cols);

}  // namespace gpulab::kernels
