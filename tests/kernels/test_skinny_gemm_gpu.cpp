// skinny_gemm against a float64 host reference: every row count 1..16 on the 7B decode shapes
// and on odd small ones (k tails, partial slabs, each slabs-per-block choice), every output mode
// and prologue, both kernels where both take the rows, outputs poisoned (rows past m must stay
// so), every element checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <cstring>

#include "common/gpu.h"
#include "kernels/llm_ops_testing.h"
#include "kernels/rmsnorm.h"
#include "kernels/silu_mul.h"
#include "kernels/skinny_gemm.h"

namespace gpulab::kernels {
namespace {

using namespace testing;
using core::DType;

constexpr int64_t kRows = kSkinnyMaxRows;

// How the result lands: written in the weights' dtype, written in float32, added to float32.
enum class Output { narrow, f32, f32_accumulate };

std::string label(SkinnyPrologue p) {
  return p == SkinnyPrologue::none ? "none" : p == SkinnyPrologue::rmsnorm ? "rmsnorm" : "swiglu";
}
std::string label(Output o) { return o == Output::narrow ? "narrow" : o == Output::f32 ? "f32" : "f32+="; }

// The kernels that take m rows of width k: the GEMV and the tensor-core kernel where both do.
std::vector<SkinnyKernel> kernels_for(int64_t m, int64_t k) {
  if (skinny_gemv_fits(m, k)) return {SkinnyKernel::gemv, SkinnyKernel::mma};
  return {SkinnyKernel::mma};
}

// Inputs for kRows rows; each row count m uses the first m (rows are independent).
struct Case {
  DType dt;
  SkinnyPrologue prologue;
  int64_t n, k;
  std::unique_ptr<DeviceTensor> x, norm, w;
  std::vector<float> input;       // the GEMM's input after the prologue, rounded to dt [kRows, k]
  std::vector<double> dot, bound;  // x·Wᵀ and |x|·|W|ᵀ [kRows, n]
  std::vector<double> largest_term;  // per row: max |input| · max |W|

  Case(DType dt_, SkinnyPrologue p, int64_t n_, int64_t k_, std::mt19937& rng, bool integers = false)
      : dt(dt_), prologue(p), n(n_), k(k_) {
    auto draw = [&](size_t count, float lo, float hi) {
      std::vector<float> v = uniform(count, rng, lo, hi);
      if (integers)
        for (float& e : v) e = std::round(e);
      return v;
    };
    w = std::make_unique<DeviceTensor>(draw(n * k, -2, 2), dt);
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
    for (float e : w->host) w_max = std::max(w_max, std::abs(e));
    for (int64_t r = 0; r < kRows; ++r) {
      float row_max = 0;
      for (int64_t i = 0; i < k; ++i) row_max = std::max(row_max, std::abs(input[r * k + i]));
      largest_term.push_back(static_cast<double>(row_max) * w_max);
    }
    dot.assign(kRows * n, 0.0);
    bound.assign(kRows * n, 0.0);
    skinny_gemm_ref(dot.data(), input.data(), w->host.data(), kRows, n, k);
    std::vector<float> abs_in(input), abs_w(w->host);
    for (float& e : abs_in) e = std::abs(e);
    for (float& e : abs_w) e = std::abs(e);
    skinny_gemm_ref(bound.data(), abs_in.data(), abs_w.data(), kRows, n, k);
  }

  static constexpr float kEps = 1e-5f;

  SkinnyInput in() const {
    return {x->device.get(), prologue, norm ? norm->device.get() : nullptr, kEps};
  }

  // Runs rows 0..m-1 into a poisoned [kRows + 1, n] output (with accumulation, rows < m hold y0)
  // and checks every element: rows < m within tolerance (or exactly: `exact`), the rest untouched.
  void check(int64_t m, Output mode, std::mt19937& rng, SkinnyKernel kernel, bool exact = false) {
    const DType out_dt = mode == Output::narrow ? dt : DType::f32;
    const std::string what = dtype_label(dt) + " " + label(prologue) + " -> " + label(mode) + " m " +
                             std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) +
                             (kernel == SkinnyKernel::gemv ? " gemv" : " mma");
    const int64_t total = (kRows + 1) * n;
    auto y = DeviceTensor::poisoned(total, out_dt);
    std::vector<float> y0;
    if (mode == Output::f32_accumulate) {
      y0 = uniform(m * n, rng, -2, 2);
      GPULAB_CHECK(cudaMemcpy(y.get(), y0.data(), m * n * 4, cudaMemcpyHostToDevice));
    }
    skinny_gemm(y.get(), out_dt, mode == Output::f32_accumulate, in(), w->device.get(), dt, m, n, k, nullptr, kernel);
    const std::vector<float> got = y.download();
    // float32 accumulation in any order: far below 1e-5 of Σ|x·w| (k ≤ 11008); one rounding of
    // the result to a narrow dtype; a prologue input rounded the other way than on the host
    // (inverse RMS or exp one float ulp apart) moves one term by a unit roundoff of itself.
    const double rel = mode == Output::narrow ? unit_roundoff(dt) : 0.0;
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
                                 : 1e-5 * (bound[i] + std::abs(base)) + rel * std::abs(want) +
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
// mistake cannot hide inside a tolerance.
TEST(SkinnyGemmGpu, IntegerInputsGiveExactSums) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(43);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{4096, 11008}, {131, 264}, {17000, 200}}) {
    Case c(DType::bf16, SkinnyPrologue::none, n, k, rng, true);
    for (int64_t m = 1; m <= kRows; ++m)
      for (SkinnyKernel kernel : kernels_for(m, k)) c.check(m, Output::f32, rng, kernel, true);
  }
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
    skinny_gemm(residual.get(), DType::f32, false, down.in(), down.w->device.get(), DType::bf16, m, hidden, inter,
                stream);
    skinny_gemm(out.get(), DType::bf16, false, {residual.get(), SkinnyPrologue::rmsnorm, norm.get(), Case::kEps},
                w.get(), DType::bf16, m, wide, hidden, stream);
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

TEST(SkinnyGemmGpu, RefusesWhatItCannotTake) {
  GPULAB_REQUIRE_GPU();
  EXPECT_FALSE(skinny_gemm_fits(17, 64));
  EXPECT_FALSE(skinny_gemm_fits(0, 64));
  EXPECT_FALSE(skinny_gemm_fits(4, 60));
  EXPECT_TRUE(skinny_gemm_fits(16, 11008));
  core::DeviceBuffer<std::byte> buf(1 << 16);
  const SkinnyInput in{buf.get()};
  EXPECT_THROW(skinny_gemm(buf.get(), DType::f32, false, in, buf.get(), DType::bf16, 17, 8, 64, nullptr), core::Error);
  EXPECT_THROW(skinny_gemm(buf.get(), DType::f32, false, in, buf.get(), DType::f32, 1, 8, 64, nullptr), core::Error);
  EXPECT_THROW(skinny_gemm(buf.get(), DType::bf16, true, in, buf.get(), DType::bf16, 1, 8, 64, nullptr), core::Error);
  EXPECT_THROW(skinny_gemm(buf.get() + 2, DType::f32, false, in, buf.get(), DType::bf16, 1, 8, 64, nullptr),
               core::Error);
  EXPECT_TRUE(skinny_gemv_fits(kGemvMaxRows, 11008));
  EXPECT_FALSE(skinny_gemv_fits(kGemvMaxRows + 1, 64));
  EXPECT_FALSE(skinny_gemv_fits(1, 1 << 20));  // its input rows would not fit in shared memory
  EXPECT_THROW(skinny_gemm(buf.get(), DType::f32, false, in, buf.get(), DType::bf16, kGemvMaxRows + 1, 8, 64, nullptr,
                           SkinnyKernel::gemv),
               core::Error);
}

}  // namespace
}  // namespace gpulab::kernels
