#include "blas/matmul.h"

#include <cublasLt.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/sanitizer.h"

namespace gpulab::blas {

using core::DType;

namespace {

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f8e4m3: return CUDA_R_8F_E4M3;
    case DType::f8e5m2: return CUDA_R_8F_E5M2;
    default: throw core::Error("cuBLASLt matmul: unsupported dtype " + std::string(core::dtype_name(dt)));
  }
}

bool is_fp8(DType dt) { return dt == DType::f8e4m3 || dt == DType::f8e5m2; }

// Largest power-of-two alignment of a pointer, capped at 16 bytes (what cuBLASLt asks about).
uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 16;
  while (a > 1 && v % a) a /= 2;
  return a;
}

}  // namespace

// One cached problem: descriptors, layouts and the chosen algorithm (the heuristic's first, or
// the fastest of its candidates when autotuning).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_x = nullptr, layout_y = nullptr, layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (layout_c) GPULAB_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(layout_c));
    if (layout_y) GPULAB_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(layout_y));
    if (layout_x) GPULAB_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(layout_x));
    if (desc) GPULAB_CHECK_NOTHROW(cublasLtMatmulDescDestroy(desc));
  }
};

// The last field: 0 unscaled, 1 per-tensor fp8 scales, 2 outer-vector fp8 scales.
using PlanKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, DType, DType, DType,
                           core::MathMode, uint32_t, uint32_t, uint32_t, int>;

struct Blas::State {
  cublasLtHandle_t handle = nullptr;
  core::DeviceBuffer<std::byte> workspace;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  int autotune = 0;  // candidates to time per new plan; ≤ 1: the heuristic's first choice
};

// racecheck keeps hundreds of hazard records for each distinct racy cuBLASLt kernel it meets (all
// in NVIDIA's `nvjet` kernels): a 2-layer 7B engine, its reports in some 20 such kernels (by every
// sign the candidates its warm-up timed), reached 117.9 GiB of host memory, and the gemm suite
// took past 9 minutes (session 43). Timings under its instrumentation would pick at random anyway.
void Blas::set_autotune(int candidates) { state_->autotune = core::under_racecheck() ? 0 : candidates; }
int Blas::autotune() const { return state_->autotune; }

Blas::Blas(size_t workspace_bytes) : state_(std::make_unique<State>()) {
  GPULAB_CHECK(cublasLtCreate(&state_->handle));
  state_->workspace = core::DeviceBuffer<std::byte>(workspace_bytes);
  core::zero_library_workspace_under_initcheck(state_->workspace.get(), state_->workspace.bytes());
}

Blas::~Blas() {
  state_->plans.clear();
  if (state_->handle) GPULAB_CHECK_NOTHROW(cublasLtDestroy(state_->handle));
}

// Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt sees X = our B as its
// first operand and Y = our A as its second, with M = n, N = m, and the same storage.
void Blas::matmul(const MatmulShape& s, const MatmulTypes& t, const void* a, const void* b, void* c,
                  cudaStream_t stream, float alpha, float beta, const Fp8Scales& scales) {
  const bool fp8 = is_fp8(t.a) || is_fp8(t.b);
  if (fp8 && (!s.transpose_b || s.transpose_a))
    throw core::Error("cuBLASLt fp8 matmul needs A stored m×k and B stored n×k (transpose_b)");
  if (s.m <= 0 || s.n <= 0 || s.k <= 0) throw core::Error("matmul: empty problem");
  const bool scaled = scales.a || scales.b;
  if (scaled && !(scales.a && scales.b)) throw core::Error("matmul: give both fp8 scales or neither");
  // cuBLASLt 13.1 answers NOT_SUPPORTED at run time for scale pointers off 16 bytes (measured
  // on the H200); say so up front.
  if (scaled && (alignment(scales.a) < 16 || alignment(scales.b) < 16))
    throw core::Error("matmul: fp8 scale pointers must be 16-byte aligned");
  if (scales.outer_vector && !(scaled && fp8)) throw core::Error("matmul: outer-vector scales are for fp8 inputs");
  const PlanKey key{s.m, s.n, s.k, s.transpose_a, s.transpose_b, t.a, t.b, t.c, t.math,
                    alignment(a), alignment(b), alignment(c), scaled ? 1 + scales.outer_vector : 0};

  auto& plan = state_->plans[key];
  if (!plan) {
    auto p = std::make_unique<Plan>();
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (t.a == DType::f32 && t.math == core::MathMode::tf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    GPULAB_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    const cublasOperation_t op_x = s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_y = s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    GPULAB_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof op_x));
    GPULAB_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof op_y));
    // Column-major storage of X (our B) and Y (our A) before op is applied.
    const int64_t x_rows = s.transpose_b ? s.k : s.n, x_cols = s.transpose_b ? s.n : s.k;
    const int64_t y_rows = s.transpose_a ? s.m : s.k, y_cols = s.transpose_a ? s.k : s.m;
    GPULAB_CHECK(cublasLtMatrixLayoutCreate(&p->layout_x, cuda_type(t.b), x_rows, x_cols, x_rows));
    GPULAB_CHECK(cublasLtMatrixLayoutCreate(&p->layout_y, cuda_type(t.a), y_rows, y_cols, y_rows));
    GPULAB_CHECK(cublasLtMatrixLayoutCreate(&p->layout_c, cuda_type(t.c), s.n, s.m, s.n));

    cublasLtMatmulPreference_t pref = nullptr;
    GPULAB_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = state_->workspace.bytes();
    GPULAB_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const uint32_t align_x = std::get<10>(key), align_y = std::get<9>(key), align_c = std::get<11>(key);
    GPULAB_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_x, sizeof align_x));
    GPULAB_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_y, sizeof align_y));
    GPULAB_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c));
    GPULAB_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c));
    if (scaled) {  // scaling changes which kernels apply: the heuristic must see it
      GPULAB_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales.b, sizeof scales.b));
      GPULAB_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales.a, sizeof scales.a));
      if (scales.outer_vector) {  // cuBLASLt's A (our B) scales its M = n rows, its B (our A) its N = m columns
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        GPULAB_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
        GPULAB_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
      }
    }
    std::vector<cublasLtMatmulHeuristicResult_t> results(std::max(1, state_->autotune));
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(state_->handle, p->desc, p->layout_x, p->layout_y, p->layout_c,
                                                                 p->layout_c, pref, int(results.size()), results.data(), &found);
    GPULAB_CHECK_NOTHROW(cublasLtMatmulPreferenceDestroy(pref));
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
      state_->plans.erase(key);
      throw core::Error("cuBLASLt has no algorithm for " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                        std::to_string(s.k) + " " + std::string(core::dtype_name(t.a)) + "·" +
                        std::string(core::dtype_name(t.b)) + "->" + std::string(core::dtype_name(t.c)) +
                        (scales.outer_vector ? " with outer-vector scales" : "") + " (" + core::status_string(status) + ")");
    }
    p->algo = results[0].algo;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    GPULAB_CHECK(cudaStreamIsCapturing(stream, &capture));
    // Scaled (fp8) plans keep the heuristic's first choice: with autotuning, the fp8 engine's
    // logits left the bf16 engine's (relative L2 0.2-0.9) and two identical engines differed.
    if (found > 1 && !scaled && capture == cudaStreamCaptureStatusNone) {
      constexpr int kTimedRuns = 5;
      // Timing overwrites C: a call that accumulates (beta != 0) is timed on a scratch C, zeroed
      // because it is read (compute-sanitizer's initcheck flagged the uninitialised reads).
      core::DeviceBuffer<std::byte> scratch(beta == 0.f ? 0 : size_t(s.m * s.n) * core::dtype_size(t.c));
      if (beta != 0.f) GPULAB_CHECK(cudaMemsetAsync(scratch.get(), 0, scratch.bytes(), stream));
      void* timed_c = beta == 0.f ? c : scratch.get();
      core::EventTimer timer(stream);
      float best = std::numeric_limits<float>::infinity();
      for (int i = 0; i < found; ++i) {
        auto launch = [&] {
          return cublasLtMatmul(state_->handle, p->desc, &alpha, b, p->layout_x, a, p->layout_y, &beta, timed_c,
                                p->layout_c, timed_c, p->layout_c, &results[i].algo, state_->workspace.get(),
                                state_->workspace.bytes(), stream);
        };
        if (launch() != CUBLAS_STATUS_SUCCESS) continue;  // the warm-up; a candidate that cannot run is skipped
        timer.start();
        bool ok = true;
        for (int r = 0; r < kTimedRuns && ok; ++r) ok = launch() == CUBLAS_STATUS_SUCCESS;
        const float ms = timer.stop();
        if (ok && ms < best) {
          best = ms;
          p->algo = results[i].algo;
        }
      }
    }
    plan = std::move(p);
  }

  if (scaled) {
    // The scale pointers may change between calls of one plan; cuBLASLt's A is our B.
    GPULAB_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales.b, sizeof scales.b));
    GPULAB_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales.a, sizeof scales.a));
  }
  if (beta == 0.f) core::zero_library_result_under_initcheck(c, size_t(s.m * s.n) * core::dtype_size(t.c), stream);
  GPULAB_CHECK(cublasLtMatmul(state_->handle, plan->desc, &alpha, b, plan->layout_x, a, plan->layout_y, &beta, c,
                              plan->layout_c, c, plan->layout_c, &plan->algo, state_->workspace.get(),
                              state_->workspace.bytes(), stream));
}

}  // namespace gpulab::blas
