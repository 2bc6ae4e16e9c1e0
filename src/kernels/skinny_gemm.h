// A GEMM for decode: few activation rows against a large weight matrix,
// y[m, n] = x[m, k] · W[n, k]ᵀ (+ y), m ≤ 16, bf16 or fp16 weights and activations, float32
// accumulation. e4m3 weights (one float scale per output channel) go two ways: beside bf16
// activations on the GEMV, up to kGemvMaxRows rows (weight-only fp8: half the bytes of a decode
// step's stream, the activations not quantized); beside e4m3 activations with per-row scales
// (W8A8) on the tensor cores, up to 16 rows: mma.sync m16n8k32, or wgmma on compute 9.0 GPUs. Decode reads each weight once per
// step, so the kernel streams W at memory speed (16-byte loads, many in flight) and puts W's rows
// on the tensor cores' 16-row side: 16 rows cost the weight traffic of one. A prologue can build the activation on the fly, removing the
// small kernel that would have written it:
//   rmsnorm: x is the float32 residual [m, k]; the input is rmsnorm(x) · norm_weight, rounded to
//            the weights' dtype as kernels::rmsnorm rounds it;
//   swiglu:  x is a fused gate/up projection [m, 2k]; the input is silu(gate) · up, rounded as
//            kernels::silu_mul rounds it (with the fast exp and divide: rarely one bf16 ulp off).
// Results are deterministic: K is split over the warps of a block and summed in a fixed order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

enum class SkinnyPrologue { none, rmsnorm, swiglu };

// An epilogue can finish the output the same way, removing the small kernel that would read it:
//   swiglu: W [n, k] is a fused gate/up projection (gate rows, then as many up rows); y [m, n/2]
//           is silu(x·Wgateᵀ) · (x·Wupᵀ), each product rounded to the output's dtype first:
//           the bits of skinny_gemm into [m, n] followed by kernels::silu_mul. Takes plain bf16 or
//           fp16 inputs and weights (the tensor-core tiles kernel at every m), y in their dtype.
enum class SkinnyEpilogue { none, swiglu };

struct SkinnyInput {
  const void* x = nullptr;  // none: [m, k] in the weights' dtype; rmsnorm: float [m, k]; swiglu: [m, 2k]
  SkinnyPrologue prologue = SkinnyPrologue::none;
  const void* norm_weight = nullptr;  // rmsnorm: [k] in the weights' dtype
  float eps = 0;                      // rmsnorm
  // W8A8: x is e4m3 [m, k] (no prologue) with these m scales, beside e4m3 weights; each output
  // is scale_row · scale_channel · Σ x·w, as cuBLASLt's outer-vector scaling computes it.
  const float* row_scales = nullptr;
};

// The weights W [n, k]: bf16 or fp16, or e4m3 with `scales` [n] (y = scale · x·Wᵀ per channel).
struct SkinnyWeights {
  const void* w = nullptr;
  core::DType dtype = core::DType::bf16;
  const float* scales = nullptr;  // e4m3 only
};

constexpr int64_t kSkinnyMaxRows = 16;

// The kernel behind skinny_gemm. mma: the tensor-core kernels above, any m (plain inputs, W8A8
// included, staged through shared memory in whole cache lines; a prologue's inputs built in
// registers from each lane's own loads). gemv: for m ≤ kGemvMaxRows, plain FMAs (a 16-byte weight piece costs 8·m), one warp per output channel,
// every block resident at once, the input rows built once per block in shared memory.
// wgmma: W8A8 only, on Hopper's warpgroup MMA with e4m3 operands straight from shared memory
// (skinny_wgmma.h; compute 9.0 GPUs only).
// automatic: W8A8 on wgmma where the GPU runs it, m > 8 and the weights are 64 MiB or more
// (skinny_gemm.cu says why), else mma; otherwise gemv where
// skinny_gemv_fits, mma elsewhere. On the H200 (7B shapes, bench decode, session 9) the GEMV
// streamed 2.95-3.98 TB/s of weights at 1 row against the tensor-core kernel's 2.83-3.43, and
// lost to it at 4 rows (2.13-2.74 against 2.69-3.23): hence 2.
enum class SkinnyKernel { automatic, gemv, mma, wgmma };

// Whether the current GPU runs SkinnyKernel::wgmma (compute 9.0: H100, H200).
bool skinny_wgmma_runs_here();
constexpr int64_t kGemvMaxRows = 2;

// Whether skinny_gemm takes these sizes for weights of w_dtype: 1 ≤ m ≤ 16 and rows of whole
// 16-byte pieces (k % 8 == 0; e4m3: k % 16 == 0). e4m3 weights beside bf16 inputs need
// skinny_gemv_fits as well.
bool skinny_gemm_fits(int64_t m, int64_t k, core::DType w_dtype = core::DType::bf16);

// Whether the GEMV kernel takes them: m ≤ kGemvMaxRows, whole 16-byte weight pieces, and the
// m input rows (2·m·k bytes) within kGemvMaxInputBytes of shared memory.
constexpr int64_t kGemvMaxInputBytes = 160 * 1024;
bool skinny_gemv_fits(int64_t m, int64_t k, core::DType w_dtype = core::DType::bf16);

// y [m, n] in y_dtype: the weights' dtype, bf16 beside e4m3 weights (written), or float32
// (written, or added to with `accumulate`: the residual stream). The activations are in the
// weights' dtype, or bf16 or e4m3 (row_scales) beside e4m3 weights; x, w, norm_weight and y start
// on 16-byte boundaries. Throws core::Error for sizes skinny_gemm_fits refuses, and for an
// epilogue beside what it does not take.
void skinny_gemm(void* y, core::DType y_dtype, bool accumulate, const SkinnyInput& in, const SkinnyWeights& w,
                 int64_t m, int64_t n, int64_t k, cudaStream_t stream, SkinnyKernel kernel = SkinnyKernel::automatic,
                 SkinnyEpilogue epilogue = SkinnyEpilogue::none);

// y[m, n] += x[m, k] · w[n, k]ᵀ in double (the input already through its prologue).
void skinny_gemm_ref(double* y, const float* x, const float* w, int64_t m, int64_t n, int64_t k);

}  // namespace gpulab::kernels
