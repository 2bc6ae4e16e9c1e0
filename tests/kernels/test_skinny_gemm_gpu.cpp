// skinny_gemm against a float64 host reference: every row count 1..16 on the 7B decode shapes
// and on odd small ones (k tails, partial slabs, each slabs-per-block choice), every output mode
// and prologue, both kernels where both take the rows, e4m3 weights with per-channel scales on
// the GEMV, outputs poisoned (rows past m must stay so), every element checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <cstring>

#include "common/gpu.h"
#include "kernels/fp8_quant.h"
#include "kernels/llm_ops_testing.h"
#include "kernels/rmsnorm.h"
#include "kernels/silu_mul.h"
#include "kernels/skinny_gemm.h"

namespace gpulab::kernels {
namespace {

using namespace testing;
using core::DType;

constexpr int64_t kRows = kSkinnyMaxRows;

// Every row count 1..kRows. Under compute-sanitizer (GPULAB_SANITIZER), whose racecheck ran the
// W8A8 test past 569 s (session 28): the GEMV's counts (1, 2), and the ends and both sides of the
// tensor-core kernels' 8-row step (one or two m-tiles); every other count takes the kernels and
// branches of one of these.
std::vector<int64_t> row_counts() {
  static_assert(kGemvMaxRows == 2);
  if (!sanitizer_tool().empty()) return {1, 2, 3, 8, 9, kRows};
  std::vector<int64_t> every(kRows);
  std::iota(every.begin(), every.end(), 1);
  return every;
}

// How the result lands: written in the weights' dtype, written in float32, added to float32.
enum class Output { narrow, f32, f32_accumulate };

std::string label(SkinnyPrologue p) {
  return p == SkinnyPrologue::none ? "none" : p == SkinnyPrologue::rmsnorm ? "rmsnorm" : "swiglu";
}
std::string label(Output o) { return o == Output::narrow ? "narrow" : o == Output::f32 ? "f32" : "f32+="; }

// The kernels that take m rows of width k (input dtype in_dt): the GEMV and the tensor-core
// kernel where they do. e4m3 weights: the GEMV beside bf16 inputs, the tensor cores beside e4m3
// (W8A8: mma.sync, and wgmma where the GPU runs it).
std::vector<SkinnyKernel> kernels_for(int64_t m, int64_t k, DType w_dt = DType::bf16, DType in_dt = DType::bf16) {
  std::vector<SkinnyKernel> all;
  if (in_dt != DType::f8e4m3 && skinny_gemv_fits(m, k, w_dt)) all.push_back(SkinnyKernel::gemv);
  if (w_dt != DType::f8e4m3 || in_dt == DType::f8e4m3) all.push_back(SkinnyKernel::mma);
  if (in_dt == DType::f8e4m3 && skinny_wgmma_runs_here()) all.push_back(SkinnyKernel::wgmma);
  return all;
}

std::string label(SkinnyKernel kernel) {
  switch (kernel) {
    case SkinnyKernel::automatic: return "automatic";
    case SkinnyKernel::gemv: return "gemv";
    case SkinnyKernel::mma: return "mma";
    case SkinnyKernel::wgmma: return "wgmma";
  }
  return "?";
}

// Inputs for kRows rows; each row count m uses the first m (rows are independent). The weights
// are in the activations' dtype dt, or e4m3 (w_dt) with a scale per output channel; e4m3
// activations (W8A8) have a scale per row.
struct Case {
  DType dt, w_dt;
  SkinnyPrologue prologue;
  int64_t n, k;
  std::unique_ptr<DeviceTensor> x, norm, w, scales, row_scales;
  std::vector<float> input;       // the GEMM's input after the prologue, rounded to dt [kRows, k]
  std::vector<double> dot, bound;  // x·Wᵀ and |x|·|W|ᵀ [kRows, n], scaled per channel and row
  std::vector<double> largest_term;  // per row: max |input · row scale| · max |W · scale|

  // integers: integer inputs and weights, and power-of-two scales, so every sum is exact.
  Case(DType dt_, SkinnyPrologue p, int64_t n_, int64_t k_, std::mt19937& rng, bool integers = false,
       std::optional<DType> w_dt_ = std::nullopt)
      : dt(dt_), w_dt(w_dt_.value_or(dt_)), prologue(p), n(n_), k(k_) {
    auto draw = [&](size_t count, float lo, float hi) {
      std::vector<float> v = uniform(count, rng, lo, hi);
      if (integers)
        for (float& e : v) e = std::round(e);
      return v;
    };
    w = std::make_unique<DeviceTensor>(draw(n * k, -2, 2), w_dt);
    const auto draw_scales = [&](int64_t count) {
      std::vector<float> v(count);
      for (float& s : v) s = integers ? std::ldexp(1.f, std::uniform_int_distribution<int>(-2, 2)(rng))
                                      : std::uniform_real_distribution<float>(0.25f, 2.f)(rng);
      return v;
    };
    std::vector<float> scale(n, 1.f), row_scale(kRows, 1.f);
    if (w_dt == DType::f8e4m3) {
      scale = draw_scales(n);
      scales = std::make_unique<DeviceTensor>(scale, DType::f32);
    }
    if (dt == DType::f8e4m3) {
      row_scale = draw_scales(kRows);
      row_scales = std::make_unique<DeviceTensor>(row_scale, DType::f32);
    }
    input.resize(kRows * k);
    if (p == SkinnyPrologue::none) {
      x = std::make_unique<DeviceTensor>(draw(kRows * k, -2, 2), dt);
      input = x->host;
    } else if (p == SkinnyPrologue::rmsnorm) {
      x = std::make_unique<DeviceTensor>(uniform(kRows * k, rng, -4, 4), DType::f32);
      norm = std::make_unique<DeviceTensor>(uniform(k, rng, 0.5f, 1.5f), dt);
      rmsnorm_ref(input.data(), x->host.data(), norm->host.data(), kRows, k, kEps);
    } else {
      x = std::make_unique<DeviceTensor>(uniform(kRows * 2 * k, rng, -3, 3), dt);
      silu_mul_ref(input.data(), x->host.data(), kRows, k);
    }
    for (float& e : input) e = round_to(e, dt);
    float w_max = 0;
    for (int64_t c = 0; c < n; ++c)
      for (int64_t i = 0; i < k; ++i) w_max = std::max(w_max, std::abs(w->host[c * k + i] * scale[c]));
    for (int64_t r = 0; r < kRows; ++r) {
      float row_max = 0;
      for (int64_t i = 0; i < k; ++i) row_max = std::max(row_max, std::abs(input[r * k + i]));
      largest_term.push_back(static_cast<double>(row_max) * row_scale[r] * w_max);
    }
    dot.assign(kRows * n, 0.0);
    bound.assign(kRows * n, 0.0);
    skinny_gemm_ref(dot.data(), input.data(), w->host.data(), kRows, n, k);
    std::vector<float> abs_in(input), abs_w(w->host);
    for (float& e : abs_in) e = std::abs(e);
    for (float& e : abs_w) e = std::abs(e);
    skinny_gemm_ref(bound.data(), abs_in.data(), abs_w.data(), kRows, n, k);
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < n; ++c) {
        dot[r * n + c] *= static_cast<double>(scale[c]) * row_scale[r];
        bound[r * n + c] *= static_cast<double>(scale[c]) * row_scale[r];
      }
  }

  static constexpr float kEps = 1e-5f;

  SkinnyInput in() const {
    return {x->device.get(), prologue, norm ? norm->device.get() : nullptr, kEps,
            row_scales ? reinterpret_cast<const float*>(row_scales->device.get()) : nullptr};
  }
  SkinnyWeights weights() const {
    return {w->device.get(), w_dt, scales ? reinterpret_cast<const float*>(scales->device.get()) : nullptr};
  }

  // Runs rows 0..m-1 into a poisoned [kRows + 1, n] output (with accumulation, rows < m hold y0)
  // and checks every element: rows < m within tolerance (or exactly: `exact`), the rest untouched.
  void check(int64_t m, Output mode, std::mt19937& rng, SkinnyKernel kernel, bool exact = false) {
    const DType narrow = w_dt == DType::f8e4m3 ? DType::bf16 : dt;
    const DType out_dt = mode == Output::narrow ? narrow : DType::f32;
    const std::string what = dtype_label(w_dt) + "·" + dtype_label(dt) + " " + label(prologue) + " -> " +
                             label(mode) + " m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                             std::to_string(k) + " " + label(kernel);
    const int64_t total = (kRows + 1) * n;
    auto y = DeviceTensor::poisoned(total, out_dt);
    std::vector<float> y0;
    if (mode == Output::f32_accumulate) {
      y0 = uniform(m * n, rng, -2, 2);
      GPULAB_CHECK(cudaMemcpy(y.get(), y0.data(), m * n * 4, cudaMemcpyHostToDevice));
    }
    skinny_gemm(y.get(), out_dt, mode == Output::f32_accumulate, in(), weights(), m, n, k, nullptr, kernel);
    const std::vector<float> got = y.download();
    // float32 accumulation in any order: far below 1e-5 of Σ|x·w| (k ≤ 11008), the scale's
    // product included; one rounding of the result to a narrow dtype; a prologue input rounded
    // the other way than on the host (inverse RMS or exp one float ulp apart) moves one term by a
    // unit roundoff of itself. wgmma adds each k32 step in e4m3 with about 14 bits kept, 4 steps
    // before a float32 add (skinny_wgmma_sm90a.cu): at most 4 · 2^-14 of Σ|x·w|.
    const double sum_rel = kernel == SkinnyKernel::wgmma ? 4.0 / 16384 : 1e-5;
    const double rel = mode == Output::narrow ? unit_roundoff(narrow) : 0.0;
    const double flip = prologue == SkinnyPrologue::none ? 0.0 : unit_roundoff(dt);
    int bad = 0;
    for (int64_t r = 0; r <= kRows; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const int64_t i = r * n + c;
        if (r >= m) {
          if (!std::isnan(got[i]) && ++bad <= 5) ADD_FAILURE() << what << ": wrote row " << r << " col " << c;
          continue;
        }
        const double base = y0.empty() ? 0.0 : y0[i];
        const double want = base + dot[i];
        const double tol = exact ? 0.0
                                 : sum_rel * bound[i] + 1e-5 * std::abs(base) + rel * std::abs(want) +
                                       flip * largest_term[r] + 1e-6;
        if ((!std::isfinite(got[i]) || std::abs(got[i] - want) > tol) && ++bad <= 5)
          ADD_FAILURE() << what << " row " << r << " col " << c << ": got " << got[i] << ", want " << want
                        << " (tolerance " << tol << ")";
      }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " elements wrong";
  }
};

constexpr Output kOutputs[] = {Output::narrow, Output::f32, Output::f32_accumulate};
constexpr SkinnyPrologue kPrologues[] = {SkinnyPrologue::none, SkinnyPrologue::rmsnorm, SkinnyPrologue::swiglu};

TEST(SkinnyGemmGpu, OddShapesEveryModeEveryRowCount) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(41);
  // (n, k): one row and one piece; k tails of 8 and 24 past whole 32-wide chunks; slabs cut by
  // n; n large enough on an H100/H200 (132 SMs) for 2 and 4 slabs per block.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 8}, {37, 72}, {200, 520}, {1000, 1048}, {9000, 136}, {17000, 64}};
  for (DType dt : {DType::bf16, DType::f16})
    for (auto [n, k] : shapes)
      for (SkinnyPrologue p : kPrologues) {
        Case c(dt, p, n, k, rng);
        for (Output mode : kOutputs)
          for (int64_t m = 1; m <= kRows; ++m)
            for (SkinnyKernel kernel : kernels_for(m, k)) c.check(m, mode, rng, kernel);
      }
}

// LLaMA-2 7B decode: qkv and gate_up after the norms, o_proj and down into the residual.
TEST(SkinnyGemmGpu, SevenBDecodeShapesEveryRowCount) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(42);
  struct Shape {
    int64_t n, k;
    SkinnyPrologue prologue;
    Output mode;
  };
  const Shape shapes[] = {{12288, 4096, SkinnyPrologue::rmsnorm, Output::narrow},
                          {4096, 4096, SkinnyPrologue::none, Output::f32_accumulate},
                          {22016, 4096, SkinnyPrologue::rmsnorm, Output::narrow},
                          {4096, 11008, SkinnyPrologue::swiglu, Output::f32_accumulate},
                          {32000, 4096, SkinnyPrologue::rmsnorm, Output::f32}};  // lm_head
  for (const Shape& s : shapes) {
    Case c(DType::bf16, s.prologue, s.n, s.k, rng);
    for (int64_t m = 1; m <= kRows; ++m)
      for (SkinnyKernel kernel : kernels_for(m, s.k)) c.check(m, s.mode, rng, kernel);
  }
}

// Integer inputs make every product and partial sum exact in float32: a fragment or k-order
// mistake cannot hide inside a tolerance. With `w8a8`, e4m3 weights and inputs (the tensor-core
// kernel); else bf16 inputs beside bf16 and e4m3 weights. e4m3 scales are powers of two.
void expect_exact_sums(std::mt19937& rng, bool w8a8) {
  const std::pair<DType, DType> bf16_inputs[] = {{DType::bf16, DType::bf16}, {DType::bf16, DType::f8e4m3}};
  const std::pair<DType, DType> fp8_inputs[] = {{DType::f8e4m3, DType::f8e4m3}};
  using Types = std::span<const std::pair<DType, DType>>;
  for (auto [in_dt, w_dt] : w8a8 ? Types(fp8_inputs) : Types(bf16_inputs))
    for (auto [n, k_bf16] : {std::pair<int64_t, int64_t>{4096, 11008}, {131, 264}, {17000, 200}}) {
      const int64_t k = w_dt == DType::f8e4m3 ? (k_bf16 + 15) / 16 * 16 : k_bf16;  // whole 16-weight loads
      Case c(in_dt, SkinnyPrologue::none, n, k, rng, true, w_dt);
      for (int64_t m : row_counts())
        for (SkinnyKernel kernel : kernels_for(m, k, w_dt, in_dt)) c.check(m, Output::f32, rng, kernel, true);
    }
}

TEST(SkinnyGemmGpu, IntegerInputsGiveExactSums) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(43);
  expect_exact_sums(rng, false);
}

// e4m3 weights with per-channel scales, on the GEMV (1 and 2 rows): every output mode and
// prologue on odd shapes (one 16-byte piece, k past whole load batches, n past whole blocks) and
// on the 7B qkv and down shapes.
TEST(SkinnyGemmGpu, Fp8WeightsOnTheGemv) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(45);
  const std::pair<int64_t, int64_t> shapes[] = {{1, 16}, {37, 80}, {1000, 1040}, {9000, 4112}};
  for (auto [n, k] : shapes)
    for (SkinnyPrologue p : kPrologues) {
      Case c(DType::bf16, p, n, k, rng, false, DType::f8e4m3);
      for (Output mode : kOutputs)
        for (int64_t m = 1; m <= kGemvMaxRows; ++m) c.check(m, mode, rng, SkinnyKernel::gemv);
    }
  Case qkv(DType::bf16, SkinnyPrologue::rmsnorm, 12288, 4096, rng, false, DType::f8e4m3);
  Case down(DType::bf16, SkinnyPrologue::swiglu, 4096, 11008, rng, false, DType::f8e4m3);
  for (int64_t m = 1; m <= kGemvMaxRows; ++m) {
    qkv.check(m, Output::narrow, rng, SkinnyKernel::automatic);
    down.check(m, Output::f32_accumulate, rng, SkinnyKernel::automatic);
  }
}

// W8A8: e4m3 inputs with per-row scales beside e4m3 weights with per-channel scales, on the
// tensor-core kernels (mma.sync m16n8k32; wgmma where the GPU runs it), every row count 1..16 and
// output mode, on odd shapes (one 16-byte piece, k past whole 64-wide chunks and 128-wide
// stages, partial slabs and 64-channel blocks) and the 7B qkv and down shapes; and exact sums on
// integer inputs.
TEST(SkinnyGemmGpu, Fp8W8A8OnTheTensorCores) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(46);
  expect_exact_sums(rng, true);
  const std::pair<int64_t, int64_t> shapes[] = {{1, 16}, {37, 80}, {1000, 1040}, {9000, 4112}, {12288, 4096},
                                                {4096, 11008}};
  for (auto [n, k] : shapes) {
    Case c(DType::f8e4m3, SkinnyPrologue::none, n, k, rng, false, DType::f8e4m3);
    for (Output mode : kOutputs)
      for (int64_t m : row_counts())
        for (SkinnyKernel kernel : kernels_for(m, k, DType::f8e4m3, DType::f8e4m3)) c.check(m, mode, rng, kernel);
  }
}

// The tiles kernel (plain inputs: bf16, and e4m3 beside e4m3 weights) and the wgmma one (W8A8,
// in clusters of 1 and 4 blocks a tile) on two small shapes at 1, 9 and 16 rows: a test
// compute-sanitizer's racecheck finishes, where the shape lists above take it past minutes
// (sessions 17 and 19).
TEST(SkinnyGemmGpu, TensorCoreKernelsSmallShapes) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(47);
  const std::pair<int64_t, int64_t> shapes[] = {{37, 80}, {300, 1040}};
  for (DType dt : {DType::bf16, DType::f8e4m3})
    for (auto [n, k] : shapes) {
      Case c(dt, SkinnyPrologue::none, n, k, rng, false, dt);
      for (int64_t m : {1, 9, 16})
        for (SkinnyKernel kernel : kernels_for(m, k, dt, dt))
          if (kernel != SkinnyKernel::gemv) c.check(m, Output::f32_accumulate, rng, kernel);
    }
}

// The swiglu epilogue writes the bits of the unfused pair: the tiles kernel into the whole
// gate/up row, then silu_mul; rows past m stay poisoned. `inter`: gate (and up) channels.
void expect_swiglu_epilogue_is_the_unfused_pair(DType dt, int64_t inter, int64_t k, std::span<const int64_t> rows,
                                                 std::mt19937& rng) {
  const int64_t n = 2 * inter;
  Case c(dt, SkinnyPrologue::none, n, k, rng);
  for (int64_t m : rows) {
    const std::string what =
        dtype_label(dt) + " inter " + std::to_string(inter) + " k " + std::to_string(k) + " m " + std::to_string(m);
    auto gate_up = DeviceTensor::poisoned(m * n, dt);
    auto want = DeviceTensor::poisoned((kRows + 1) * inter, dt);
    auto got = DeviceTensor::poisoned((kRows + 1) * inter, dt);
    skinny_gemm(gate_up.get(), dt, false, c.in(), c.weights(), m, n, k, nullptr, SkinnyKernel::mma);
    silu_mul(want.get(), gate_up.get(), m, inter, dt, nullptr);
    skinny_gemm(got.get(), dt, false, c.in(), c.weights(), m, n, k, nullptr, SkinnyKernel::automatic,
                SkinnyEpilogue::swiglu);
    const std::vector<float> a = want.download(), b = got.download();
    int bad = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const bool same = std::isnan(a[i]) ? std::isnan(b[i]) : a[i] == b[i];
      if (!same && ++bad <= 5) ADD_FAILURE() << what << " element " << i << ": got " << b[i] << ", want " << a[i];
    }
    EXPECT_EQ(bad, 0) << what;
    EXPECT_TRUE(std::isfinite(b[m * inter - 1]) && std::isnan(b[m * inter])) << what;
  }
}

// bf16 and fp16, every row count: one gate channel, a partial slab (37), k tails past whole tiles.
// Small enough for compute-sanitizer's racecheck.
TEST(SkinnyGemmGpu, SwiGluEpilogueOddShapesEveryRowCount) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(48);
  std::vector<int64_t> every(kRows);
  std::iota(every.begin(), every.end(), 1);
  for (DType dt : {DType::bf16, DType::f16})
    for (auto [inter, k] : {std::pair<int64_t, int64_t>{1, 8}, {37, 72}, {200, 1048}})
      expect_swiglu_epilogue_is_the_unfused_pair(dt, inter, k, every, rng);
}

// LLaMA-2 7B gate_up at the row counts the engine's plain decode takes it (3 to 16).
TEST(SkinnyGemmGpu, SwiGluEpilogueSevenBGateUp) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(49);
  const int64_t rows[] = {3, 8, 9, 16};
  expect_swiglu_epilogue_is_the_unfused_pair(DType::bf16, 11008, 4096, rows, rng);
}

// Back to back on one stream, the second launch (programmatic dependent launch) starts while
// the first runs: it must still read the first's output, not the poison under it. At 16 rows
// (the tensor-core kernel) and at 1 (the GEMV).
class SkinnyGemmChainGpu : public ::testing::TestWithParam<int64_t> {};

TEST_P(SkinnyGemmChainGpu, ChainedLaunchesSeeTheEarlierOutput) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(44);
  const int64_t m = GetParam(), hidden = 4096, inter = 11008, wide = 22016;
  Case down(DType::bf16, SkinnyPrologue::swiglu, hidden, inter, rng);
  DeviceTensor norm(uniform(hidden, rng, 0.5f, 1.5f), DType::bf16), w(uniform(wide * hidden, rng, -2, 2), DType::bf16);
  core::Stream stream;
  for (int rep = 0; rep < 3; ++rep) {
    auto residual = DeviceTensor::poisoned(m * hidden, DType::f32);
    auto out = DeviceTensor::poisoned(m * wide, DType::bf16);
    GPULAB_CHECK(cudaDeviceSynchronize());  // the poison is in place before the non-blocking stream runs
    skinny_gemm(residual.get(), DType::f32, false, down.in(), down.weights(), m, hidden, inter, stream);
    skinny_gemm(out.get(), DType::bf16, false, {residual.get(), SkinnyPrologue::rmsnorm, norm.get(), Case::kEps},
                {w.get(), DType::bf16}, m, wide, hidden, stream);
    stream.synchronize();
    const std::vector<float> x = residual.download(), got = out.download();
    std::vector<float> input(m * hidden);
    rmsnorm_ref(input.data(), x.data(), norm.host.data(), m, hidden, Case::kEps);
    for (float& e : input) e = round_to(e, DType::bf16);
    std::vector<double> want(m * wide, 0.0), bound(m * wide, 0.0);
    skinny_gemm_ref(want.data(), input.data(), w.host.data(), m, wide, hidden);
    for (float& e : input) e = std::abs(e);
    std::vector<float> abs_w(w.host);
    for (float& e : abs_w) e = std::abs(e);
    skinny_gemm_ref(bound.data(), input.data(), abs_w.data(), m, wide, hidden);
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      // One rounding of the output, and room for one input rounded the other way (|input · w| < 16).
      const double tol = 1e-5 * bound[i] + unit_roundoff(DType::bf16) * (std::abs(want[i]) + 16.0) + 1e-6;
      if ((!std::isfinite(got[i]) || std::abs(got[i] - want[i]) > tol) && ++bad <= 5)
        ADD_FAILURE() << "rep " << rep << " element " << i << ": got " << got[i] << ", want " << want[i];
    }
    EXPECT_EQ(bad, 0) << "rep " << rep;
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, SkinnyGemmChainGpu, ::testing::Values(1, 16));

// W8A8 on wgmma right after the kernel that quantizes its input, both launched overlapped on one
// stream: the producer's copies of x must wait for it, not read the poison under it (0xFF is an
// e4m3 NaN). Clusters of 4 blocks a tile here (64 tiles of 64 channels).
TEST(SkinnyGemmGpu, WgmmaWaitsForTheQuantizedInput) {
  GPULAB_REQUIRE_GPU();
  if (!skinny_wgmma_runs_here()) GTEST_SKIP() << "wgmma runs on compute 9.0 GPUs only";
  std::mt19937 rng(50);
  const int64_t m = kRows, n = 4096, k = 4096;
  const DeviceTensor w(uniform(n * k, rng, -2, 2), DType::f8e4m3), scales(uniform(n, rng, 0.5f, 2.f), DType::f32);
  core::Stream stream;
  for (int rep = 0; rep < 3; ++rep) {
    const DeviceTensor x(uniform(m * k, rng, -4, 4), DType::bf16);
    auto q = DeviceTensor::poisoned(m * k, DType::f8e4m3);
    auto row_scales = DeviceTensor::poisoned(m, DType::f32);
    auto y = DeviceTensor::poisoned(m * n, DType::f32);
    GPULAB_CHECK(cudaDeviceSynchronize());  // the poison is in place before the non-blocking stream runs
    fp8_quantize(q.get(), reinterpret_cast<float*>(row_scales.get()), x.device.get(), DType::bf16, m, k,
                 Fp8Granularity::row, nullptr, stream);
    skinny_gemm(y.get(), DType::f32, false,
                {q.get(), SkinnyPrologue::none, nullptr, 0.f, reinterpret_cast<const float*>(row_scales.get())},
                {w.device.get(), DType::f8e4m3, reinterpret_cast<const float*>(scales.device.get())}, m, n, k, stream,
                SkinnyKernel::wgmma);
    stream.synchronize();
    const std::vector<float> input = q.download(), row_scale = row_scales.download(), got = y.download();
    std::vector<float> abs_in(input), abs_w(w.host);
    for (float& e : abs_in) e = std::abs(e);
    for (float& e : abs_w) e = std::abs(e);
    std::vector<double> want(m * n, 0.0), bound(m * n, 0.0);
    skinny_gemm_ref(want.data(), input.data(), w.host.data(), m, n, k);
    skinny_gemm_ref(bound.data(), abs_in.data(), abs_w.data(), m, n, k);
    int bad = 0;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const int64_t i = r * n + c;
        const double s = static_cast<double>(row_scale[r]) * scales.host[c];
        const double tol = 4.0 / 16384 * bound[i] * s + 1e-6;  // as Case::check allows wgmma
        if ((!std::isfinite(got[i]) || std::abs(got[i] - want[i] * s) > tol) && ++bad <= 5)
          ADD_FAILURE() << "rep " << rep << " row " << r << " col " << c << ": got " << got[i] << ", want "
                        << want[i] * s;
      }
    EXPECT_EQ(bad, 0) << "rep " << rep;
  }
}

TEST(SkinnyGemmGpu, RefusesWhatItCannotTake) {
  GPULAB_REQUIRE_GPU();
  EXPECT_FALSE(skinny_gemm_fits(17, 64));
  EXPECT_FALSE(skinny_gemm_fits(0, 64));
  EXPECT_FALSE(skinny_gemm_fits(4, 60));
  EXPECT_TRUE(skinny_gemm_fits(16, 11008));
  core::DeviceBuffer<std::byte> buf(1 << 16);
  const SkinnyInput in{buf.get()};
  const SkinnyWeights bf16{buf.get()}, fp8{buf.get(), DType::f8e4m3, reinterpret_cast<const float*>(buf.get())};
  const auto refused = [&](void* y, DType y_dt, bool accumulate, const SkinnyWeights& w, int64_t m, int64_t k,
                           SkinnyKernel kernel = SkinnyKernel::automatic) {
    EXPECT_THROW(skinny_gemm(y, y_dt, accumulate, in, w, m, 8, k, nullptr, kernel), core::Error)
        << dtype_label(w.dtype) << " m " << m << " k " << k;
  };
  refused(buf.get(), DType::f32, false, bf16, 17, 64);
  refused(buf.get(), DType::f32, false, {buf.get(), DType::f32}, 1, 64);
  refused(buf.get(), DType::bf16, true, bf16, 1, 64);
  refused(buf.get() + 2, DType::f32, false, bf16, 1, 64);
  EXPECT_TRUE(skinny_gemv_fits(kGemvMaxRows, 11008));
  EXPECT_FALSE(skinny_gemv_fits(kGemvMaxRows + 1, 64));
  EXPECT_FALSE(skinny_gemv_fits(1, 1 << 20));  // its input rows would not fit in shared memory
  refused(buf.get(), DType::f32, false, bf16, kGemvMaxRows + 1, 64, SkinnyKernel::gemv);
  // e4m3 weights beside bf16 inputs: the GEMV's rows only, whole 16-weight loads, their scales.
  EXPECT_TRUE(skinny_gemv_fits(kGemvMaxRows, 11008, DType::f8e4m3));
  EXPECT_FALSE(skinny_gemv_fits(kGemvMaxRows + 1, 64, DType::f8e4m3));
  EXPECT_FALSE(skinny_gemm_fits(1, 72, DType::f8e4m3));
  refused(buf.get(), DType::f32, false, fp8, kGemvMaxRows + 1, 64);  // bf16 inputs: the GEMV's rows
  refused(buf.get(), DType::f32, false, fp8, 1, 72);
  refused(buf.get(), DType::f32, false, fp8, 1, 64, SkinnyKernel::mma);
  refused(buf.get(), DType::f32, false, bf16, 1, 64, SkinnyKernel::wgmma);  // W8A8 only
  // W8A8 (e4m3 inputs with row scales): the tensor-core kernel's rows, e4m3 weights, no prologue.
  const float* row_scales = fp8.scales;
  const auto w8a8_refused = [&](const SkinnyInput& x, const SkinnyWeights& w, int64_t m, SkinnyKernel kernel) {
    EXPECT_THROW(skinny_gemm(buf.get(), DType::f32, false, x, w, m, 8, 64, nullptr, kernel), core::Error) << m;
  };
  const SkinnyInput quantized{buf.get(), SkinnyPrologue::none, nullptr, 0.f, row_scales};
  EXPECT_TRUE(skinny_gemm_fits(kRows, 64, DType::f8e4m3));
  w8a8_refused(quantized, fp8, kRows + 1, SkinnyKernel::automatic);
  w8a8_refused(quantized, fp8, 1, SkinnyKernel::gemv);
  w8a8_refused(quantized, bf16, 1, SkinnyKernel::automatic);
  w8a8_refused({buf.get(), SkinnyPrologue::rmsnorm, buf.get(), 1e-5f, row_scales}, fp8, 1, SkinnyKernel::automatic);
  refused(buf.get(), DType::f32, false, {buf.get(), DType::f8e4m3}, 1, 64);  // no scales
  refused(buf.get(), DType::f32, false, {buf.get(), DType::bf16, fp8.scales}, 1, 64);
  refused(buf.get(), DType::f8e4m3, false, fp8, 1, 64);  // writes bf16 or float32
  // The swiglu epilogue: plain bf16/fp16 inputs and weights, an even n, y in their dtype, the tiles kernel.
  const auto swiglu_refused = [&](const SkinnyInput& x, const SkinnyWeights& w, DType y_dt, int64_t n,
                                  SkinnyKernel kernel) {
    EXPECT_THROW(skinny_gemm(buf.get(), y_dt, false, x, w, 1, n, 64, nullptr, kernel, SkinnyEpilogue::swiglu),
                 core::Error)
        << dtype_label(w.dtype) << " -> " << dtype_label(y_dt) << " n " << n;
  };
  swiglu_refused(in, bf16, DType::bf16, 7, SkinnyKernel::automatic);
  swiglu_refused(in, bf16, DType::f32, 8, SkinnyKernel::automatic);
  swiglu_refused(in, bf16, DType::bf16, 8, SkinnyKernel::gemv);
  swiglu_refused(in, fp8, DType::bf16, 8, SkinnyKernel::automatic);
  swiglu_refused({buf.get(), SkinnyPrologue::rmsnorm, buf.get(), 1e-5f}, bf16, DType::bf16, 8, SkinnyKernel::mma);
  swiglu_refused(quantized, fp8, DType::bf16, 8, SkinnyKernel::mma);
}

}  // namespace
}  // namespace gpulab::kernels
