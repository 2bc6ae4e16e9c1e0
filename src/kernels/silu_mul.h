// The SwiGLU gate of the LLaMA MLP on a fused gate/up projection:
// out[r, i] = silu(gate_up[r, i]) · gate_up[r, inter + i], math in float32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

void silu_mul(void* out, const void* gate_up, int64_t rows, int64_t inter, core::DType dtype, cudaStream_t stream);

// silu_mul's output (in dtype) quantized to e4m3 per row into out [rows, inter] and scales [rows],
// bit for bit as fp8_quantize(Fp8Granularity::row) quantizes it: one kernel instead of two.
void silu_mul_fp8(void* out, float* scales, const void* gate_up, int64_t rows, int64_t inter, core::DType dtype,
                  cudaStream_t stream);

void silu_mul_ref(float* out, const float* gate_up, int64_t rows, int64_t inter);

}  // namespace gpulab::kernels
