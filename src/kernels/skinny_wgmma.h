// skinny_gemm's W8A8 kernel on Hopper's warpgroup MMA, which multiplies e4m3 natively (sm_90a):
// TMA streams 64 weight rows × 128 bytes of k and the 16 activation rows beside them into a ring
// of shared-memory stages; one warpgroup runs wgmma m64n16k32 on each stage. Internal to
// skinny_gemm, which checks sizes and pointers first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gpulab::kernels {

// y [m, n] (float32, added to with `accumulate`, or bf16) = row_scales[r] · w_scales[c] · x·Wᵀ,
// x e4m3 [m, k], W e4m3 [n, k]; m ≤ 16, k % 16 == 0, x and W 16-byte aligned.
void skinny_w8a8_wgmma(void* y, bool y_f32, bool accumulate, const void* x, const float* row_scales, const void* w,
                       const float* w_scales, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace gpulab::kernels
