// The GEMM ladder of `gpulab bench gemm`: five steps from the textbook kernel to Hopper's tensor
// cores, each a readable stand-alone kernel. All compute C[m×n] = A[m×k] · B[k×n], row-major,
// accumulate in fp32, and write fp32 C. The CPU reference is gemm_ladder_ref.cpp.
// B is stored k×n, except for wgmma, which takes it stored n×k (both operands K-major, as the
// tensor memory accelerator and wgmma want them; gemm_step_b_transposed says which).
//
// Sizes: naive and smem_tiled take any m, n, k. The others need multiples of their tile and
// throw core::InputError naming the rule otherwise (gemm_ladder_size_rule says it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace gpulab::kernels {

enum class GemmStep { naive, smem_tiled, register_blocked, mma_sync, wgmma };

inline constexpr GemmStep kGemmSteps[] = {GemmStep::naive, GemmStep::smem_tiled, GemmStep::register_blocked,
                                          GemmStep::mma_sync, GemmStep::wgmma};

std::string gemm_step_name(GemmStep s);  // "naive", "smem_tiled", ...
// The input precisions a step takes (fp32 for 1..3; fp16 and bf16 for mma_sync; bf16 for wgmma).
bool gemm_step_supports(GemmStep s, core::DType input);
// "" when (m, n, k) is fine for the step, else what the step needs.
std::string gemm_step_size_rule(GemmStep s, int64_t m, int64_t n, int64_t k);
// Whether the step can run on the current device with this build (wgmma needs sm_90a code and
// a compute capability 9.0 device; mma_sync needs 153 KiB of shared memory per block, which
// H100/H200, A100 and B200 allow and consumer GPUs (≤ 99 KiB) do not).
bool gemm_step_available(GemmStep s);
// Whether the step takes B stored n×k instead of k×n.
inline bool gemm_step_b_transposed(GemmStep s) { return s == GemmStep::wgmma; }

// Runs a step on device pointers: a and b hold `input` elements (b stored as the step wants it),
// c is fp32.
void gemm_ladder(GemmStep s, core::DType input, const void* a, const void* b, float* c, int64_t m,
                 int64_t n, int64_t k, cudaStream_t stream);

// The steps one by one (gemm_ladder dispatches to these).
void gemm_naive(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t stream);
void gemm_smem_tiled(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t stream);
void gemm_register_blocked(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t stream);
void gemm_mma_sync(core::DType input, const void* a, const void* b, float* c, int m, int n, int k, cudaStream_t stream);
void gemm_wgmma(const void* a, const void* b_nk, float* c, int m, int n, int k, cudaStream_t stream);  // bf16, B n×k
bool gemm_wgmma_compiled();  // this build carries sm_90a code for it
size_t gemm_mma_sync_smem_bytes();  // dynamic shared memory per block of the mma_sync step

// CPU reference: c = a·b with double accumulation, rounded once to float.
void gemm_reference(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k);

}  // namespace gpulab::kernels
