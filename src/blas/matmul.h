// cuBLASLt matrix products for every module (the GEMM benchmarks, the LLaMA engine, training).
// Row-major throughout, as the rest of gpulab stores tensors:
//   C[m×n] = alpha · op(A) · op(B) + beta · C,   op(A) is m×k, op(B) is k×n.
// A linear layer y = x·Wᵀ with W stored [out, in] is {m=tokens, n=out, k=in, transpose_b=true}.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"

namespace gpulab::blas {

struct MatmulShape {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false;  // A stored k×m
  bool transpose_b = false;  // B stored n×k
};

struct MatmulTypes {
  core::DType a = core::DType::f32, b = core::DType::f32, c = core::DType::f32;
  core::MathMode math = core::MathMode::strict_fp32;  // tf32 allowed only when set
};

// fp8 scales (device pointers, each 16-byte aligned as cuBLASLt requires). Per tensor (one
// float each): C = (scale_a·A)(scale_b·B). Outer vector (cuBLAS 12.9+ on Hopper): scale_a holds
// m floats (one per row of A), scale_b n floats (one per row of B stored n×k, i.e. per output
// column): C[i, j] = scale_a[i]·scale_b[j]·(A·Bᵀ)[i, j] (per-token activations times
// per-output-channel weights).
struct Fp8Scales {
  const float* a = nullptr;
  const float* b = nullptr;
  bool outer_vector = false;
};

// Owns a cuBLASLt handle and workspace, and caches the chosen algorithm per problem.
// One per device and thread; not thread-safe.
// By default the algorithm is the heuristic's first choice. With autotuning on, the plan made by a
// call outside stream capture asks the heuristic for up to `candidates` algorithms, runs each on
// that call's own operands (into a scratch C when the call accumulates; one warm-up, then a few
// timed back-to-back launches) and keeps the fastest: what a benchmark wants, at the cost of a
// synchronisation and some dozens of extra products once per shape. Plans made before the
// switch keep their choice.
class Blas {
 public:
  explicit Blas(size_t workspace_bytes = 32u << 20);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // Throws core::Error naming the problem when cuBLASLt has no algorithm for it.
  void matmul(const MatmulShape& shape, const MatmulTypes& types, const void* a, const void* b,
              void* c, cudaStream_t stream, float alpha = 1.f, float beta = 0.f,
              const Fp8Scales& scales = {});

  // ≤ 1: off. Under compute-sanitizer's racecheck always off (matmul.cpp says why).
  void set_autotune(int candidates);
  int autotune() const;  // the candidates a new plan times; ≤ 1: the heuristic's first choice

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace gpulab::blas
