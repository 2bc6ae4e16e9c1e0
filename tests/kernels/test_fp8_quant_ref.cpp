// The fp8 quantization math of the CPU reference (which the GPU kernels match bit for bit):
// scales from the amax, the round-trip error bound of e4m3, per-row against per-tensor scales.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/fp8_quant.h"

namespace gpulab::kernels {
namespace {

float dequant(uint8_t q, float s) { return s * core::f8e4m3_bits_to_float(q); }

// Rows of normal values, row r multiplied by magnitudes[r].
std::vector<float> rows_of(const std::vector<float>& magnitudes, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n;
  std::vector<float> x(magnitudes.size() * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = magnitudes[i / cols] * n(rng);
  return x;
}

// e4m3 keeps 3 mantissa bits: a normal value is off by at most half an ulp, 2^-4 relative;
// below 2^-6 (subnormals, step 2^-9) by at most 2^-10 absolute, in units of the scale.
float error_bound(float x, float s) { return std::max(std::ldexp(std::fabs(x), -4), std::ldexp(s, -10)); }

TEST(Fp8QuantRef, RowScaleMapsTheRowMaxTo448) {
  const int64_t cols = 300;
  const std::vector<float> mags = {1.0f, 3e-2f, 250.0f, 1e-5f};
  const std::vector<float> x = rows_of(mags, cols, 1);
  std::vector<uint8_t> q(x.size(), 0xAA);
  std::vector<float> s(mags.size(), NAN);
  fp8_quantize_ref(q.data(), s.data(), x.data(), 4, cols, Fp8Granularity::row);
  for (int64_t r = 0; r < 4; ++r) {
    float amax = 0;
    int64_t at = 0;
    for (int64_t c = 0; c < cols; ++c)
      if (std::fabs(x[r * cols + c]) > amax) amax = std::fabs(x[r * cols + c]), at = c;
    EXPECT_EQ(s[r], amax / 448.0f) << "row " << r;
    EXPECT_EQ(s[r], fp8_scale_for_amax(amax));
    EXPECT_EQ(std::fabs(core::f8e4m3_bits_to_float(q[r * cols + at])), 448.0f) << "row " << r;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = core::f8e4m3_bits_to_float(q[r * cols + c]);
      ASSERT_TRUE(std::isfinite(v));
      ASSERT_LE(std::fabs(v), 448.0f);
      ASSERT_EQ(std::signbit(v) && v != 0, x[r * cols + c] < 0 && v != 0);
    }
  }
}

TEST(Fp8QuantRef, RoundTripIsWithinHalfAnE4m3Step) {
  const int64_t rows = 64, cols = 257;
  std::vector<float> mags(rows);
  for (int64_t r = 0; r < rows; ++r) mags[r] = std::ldexp(1.0f, static_cast<int>(r % 40) - 20);
  const std::vector<float> x = rows_of(mags, cols, 2);
  for (Fp8Granularity g : {Fp8Granularity::row, Fp8Granularity::tensor}) {
    std::vector<uint8_t> q(x.size());
    std::vector<float> s(rows);
    fp8_quantize_ref(q.data(), s.data(), x.data(), rows, cols, g);
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float sr = s[i / cols], back = dequant(q[i], sr);
      ASSERT_LE(std::fabs(back - x[i]), error_bound(x[i], sr) * (1 + 1e-6f)) << "element " << i;
      num += double(back - x[i]) * (back - x[i]);
      den += double(x[i]) * x[i];
    }
    if (g == Fp8Granularity::row) {
      EXPECT_LT(std::sqrt(num / den), 0.04);  // ~2^-4/sqrt(3) at most
    }
  }
}

// One row far smaller than the others: a per-tensor scale flushes it to zero, per-row scales
// keep it as accurate as the rest.
TEST(Fp8QuantRef, PerRowScalesKeepSmallRowsThatPerTensorLoses) {
  const int64_t cols = 512;
  const std::vector<float> mags = {1.0f, 3e-5f, 1e-7f};
  const std::vector<float> x = rows_of(mags, cols, 3);
  std::vector<uint8_t> qr(x.size()), qt(x.size());
  std::vector<float> sr(3), st(3);
  fp8_quantize_ref(qr.data(), sr.data(), x.data(), 3, cols, Fp8Granularity::row);
  fp8_quantize_ref(qt.data(), st.data(), x.data(), 3, cols, Fp8Granularity::tensor);
  EXPECT_EQ(st[0], st[1]);
  EXPECT_EQ(st[1], st[2]);
  EXPECT_EQ(st[0], sr[0]);  // row 0 holds the tensor's max
  auto rel_err = [&](const std::vector<uint8_t>& q, const std::vector<float>& s, int64_t r) {
    double num = 0, den = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double d = dequant(q[r * cols + c], s[r]) - x[r * cols + c];
      num += d * d;
      den += double(x[r * cols + c]) * x[r * cols + c];
    }
    return std::sqrt(num / den);
  };
  for (int64_t r = 0; r < 3; ++r) EXPECT_LT(rel_err(qr, sr, r), 0.04) << "per-row, row " << r;
  EXPECT_LT(rel_err(qt, st, 0), 0.04);
  EXPECT_GT(rel_err(qt, st, 1), 2 * rel_err(qr, sr, 1));  // subnormal range: coarse
  EXPECT_EQ(rel_err(qt, st, 2), 1.0);                      // every value flushed to zero
}

TEST(Fp8QuantRef, ZeroRowGetsAFiniteScaleAndZeros) {
  std::vector<float> x(2 * 40, 0.0f);
  x[40 + 7] = -2.0f;
  std::vector<uint8_t> q(x.size(), 0xAA);
  std::vector<float> s(2);
  fp8_quantize_ref(q.data(), s.data(), x.data(), 2, 40, Fp8Granularity::row);
  EXPECT_EQ(s[0], kFp8MinAmax / 448.0f);
  EXPECT_GT(s[0], 0.0f);
  for (int c = 0; c < 40; ++c) EXPECT_EQ(q[c], 0) << c;
  EXPECT_EQ(dequant(q[47], s[1]), -2.0f);
}

TEST(Fp8QuantRef, AccumulateAdds) {
  std::vector<float> x = {1, 2, 3}, y = {0.5f, -2, 10};
  accumulate_ref(x.data(), y.data(), 3);
  EXPECT_EQ(x, (std::vector<float>{1.5f, 0, 13}));
}

}  // namespace
}  // namespace gpulab::kernels
