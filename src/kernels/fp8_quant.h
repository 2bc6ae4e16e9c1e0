// fp8 e4m3 quantization with dynamic scales, for the fp8 linear layers of the LLaMA engine
// (weights at load, activations every step, inside CUDA graphs: no host synchronization).
//   s = max(amax, kFp8MinAmax) / 448,   q = e4m3_satfinite(x / s),   x ≈ s · q
// Per row (one scale per output channel of a weight [n, k], or per token of an activation) or
// per tensor (one amax over all rows; the scale is written once per row, so the GEMM takes the
// same outer-vector scale layout in both modes).
#pragma once

#include <cuda_runtime_api.h>
#ifdef __CUDACC__
#include <cuda_fp8.h>
#endif

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

constexpr float kFp8E4m3Max = 448.0f;
// Keeps s away from zero (an all-zero row quantizes to zeros with a harmless scale).
constexpr float kFp8MinAmax = 1e-12f;

#ifdef __CUDACC__
__host__ __device__
#endif
inline float fp8_scale_for_amax(float amax) {
  return (amax > kFp8MinAmax ? amax : kFp8MinAmax) / kFp8E4m3Max;
}

#ifdef __CUDACC__
// x / s in e4m3, saturating: every kernel that quantizes (fp8_quantize, rmsnorm_fp8,
// silu_mul_fp8) converts through this, so their bytes agree bit for bit.
__device__ inline __nv_fp8_storage_t fp8_quantize_value(float x, float s) {
  return __nv_cvt_float_to_fp8(x / s, __NV_SATFINITE, __NV_E4M3);
}

// N elements of E as one aligned access: the kernels that quantize rows read 16 bytes of them at
// a time (kPackOf<E> elements) and write the e4m3 bytes those quantize to.
template <class E, int N>
struct alignas(sizeof(E) * N) Pack {
  E v[N];
};
template <class E>
constexpr int kPackOf = 16 / sizeof(E);
#endif

// Whether rows of `cols` elements of `elem_bytes` bytes at `in`, and their e4m3 rows at `out`,
// move in packs: every row starts on 16 bytes in and on the pack's element count out.
inline bool fp8_rows_pack(const void* in, const void* out, int64_t cols, size_t elem_bytes) {
  const int64_t per_pack = 16 / static_cast<int64_t>(elem_bytes);
  return cols % per_pack == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(out) % per_pack == 0;
}

enum class Fp8Granularity { row, tensor };

// out: rows·cols e4m3 bytes; scales: rows floats; in: rows·cols of `in_dtype` (fp32/fp16/bf16).
// `row_amax` (rows floats of workspace) is needed for tensor granularity only.
void fp8_quantize(void* out, float* scales, const void* in, core::DType in_dtype, int64_t rows, int64_t cols,
                  Fp8Granularity granularity, float* row_amax, cudaStream_t stream);

// x[i] += y[i] for a float32 x and y of `y_dtype` (fp32/fp16/bf16): the residual add after an fp8
// linear layer whose GEMM writes bf16 (where cuBLASLt cannot accumulate into float itself).
void accumulate(float* x, const void* y, core::DType y_dtype, int64_t n, cudaStream_t stream);

// CPU references: bit-identical results (division and the conversion both round to nearest even).
void fp8_quantize_ref(uint8_t* out, float* scales, const float* in, int64_t rows, int64_t cols,
                      Fp8Granularity granularity);
void accumulate_ref(float* x, const float* y, int64_t n);

}  // namespace gpulab::kernels
