// Greedy sampling: the index of the largest value of each row (the first one on ties).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

void argmax(int32_t* out, const void* x, int64_t rows, int64_t cols, core::DType dtype, cudaStream_t stream);

void argmax_ref(int32_t* out, const float* x, int64_t rows, int64_t cols);

}  // namespace gpulab::kernels
