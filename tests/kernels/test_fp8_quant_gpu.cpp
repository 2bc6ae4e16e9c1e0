// The fp8 quantization kernels against their CPU reference, bit for bit (bytes and scales), for
// every input dtype, both granularities, rows longer and shorter than a block, a zero row, and
// repeated calls (per-tensor scaling keeps no state between steps); the residual accumulate; and
// the fused rmsnorm_fp8 / silu_mul_fp8 against their two-kernel composition, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "common/gpu.h"
#include "kernels/fp8_quant.h"
#include "kernels/llm_ops_testing.h"
#include "kernels/rmsnorm.h"
#include "kernels/silu_mul.h"

namespace gpulab::kernels {
namespace {

using core::DType;
using testing::DeviceTensor;

void check_quantize(DType dt, Fp8Granularity g, int64_t rows, int64_t cols, float magnitude, std::mt19937& rng) {
  SCOPED_TRACE(testing::dtype_label(dt) + (g == Fp8Granularity::row ? " per row " : " per tensor ") +
               std::to_string(rows) + "x" + std::to_string(cols) + " magnitude " + std::to_string(magnitude));
  std::vector<float> x = testing::uniform(rows * cols, rng, -magnitude, magnitude);
  // Rows of varied size, so per-row and per-tensor scales differ; row 1 (when present) is zero.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] *= r == 1 ? 0.0f : std::ldexp(1.0f, static_cast<int>(r % 7) - 3);
  DeviceTensor in(x, dt);  // rounded to dt: the reference sees the same values
  core::DeviceBuffer<uint8_t> q(rows * cols);
  core::DeviceBuffer<float> scales(rows), row_amax(rows);
  GPULAB_CHECK(cudaMemset(q.get(), 0xFF, q.bytes()));  // NaN in e4m3
  GPULAB_CHECK(cudaMemset(scales.get(), 0xFF, scales.bytes()));
  fp8_quantize(q.get(), scales.get(), in.get(), dt, rows, cols, g, row_amax.get(), nullptr);
  GPULAB_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> got(rows * cols), want(rows * cols);
  std::vector<float> got_s(rows), want_s(rows);
  GPULAB_CHECK(cudaMemcpy(got.data(), q.get(), got.size(), cudaMemcpyDeviceToHost));
  GPULAB_CHECK(cudaMemcpy(got_s.data(), scales.get(), rows * 4, cudaMemcpyDeviceToHost));
  fp8_quantize_ref(want.data(), want_s.data(), in.host.data(), rows, cols, g);
  for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(got_s[r], want_s[r]) << "scale of row " << r;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && ++bad <= 5)
      ADD_FAILURE() << "element " << i << ": " << int(got[i]) << " vs " << int(want[i]) << " (x = " << in.host[i] << ")";
  EXPECT_EQ(bad, 0);
}

TEST(Fp8QuantGpu, MatchesTheReferenceBitForBit) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(21);
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (Fp8Granularity g : {Fp8Granularity::row, Fp8Granularity::tensor}) {
      check_quantize(dt, g, 1, 16, 1.0f, rng);
      check_quantize(dt, g, 16, 4096, 3.0f, rng);  // a decode step's activation
      check_quantize(dt, g, 37, 1000, 0.02f, rng);
      check_quantize(dt, g, 5, 1001, 1.0f, rng);  // rows that cannot move in 16-byte packs
      check_quantize(dt, g, 3, 37, 1.0f, rng);
      check_quantize(dt, g, 1500, 352, 100.0f, rng);  // more rows than threads: per-tensor's amax loop
      check_quantize(dt, g, 1500, 352, 1e-3f, rng);   // again, smaller: nothing kept from the last call
    }
}

TEST(Fp8QuantGpu, AccumulateAddsIntoTheFloatResidual) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(22);
  for (DType dt : {DType::bf16, DType::f32})
    for (int64_t n : {1, 1000, 70000}) {
      DeviceTensor x(testing::uniform(n, rng, -4, 4), DType::f32), y(testing::uniform(n, rng), dt);
      std::vector<float> want = x.host;
      accumulate_ref(want.data(), y.host.data(), n);
      accumulate(static_cast<float*>(x.get()), y.get(), dt, n, nullptr);
      EXPECT_EQ(x.download(), want) << testing::dtype_label(dt) << " n=" << n;
    }
}

// The e4m3 bytes and scales of `rows` quantized rows, from the device.
struct Quantized {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  bool operator==(const Quantized&) const = default;
};

template <class Run>
Quantized quantized(int64_t rows, int64_t cols, Run&& run) {
  core::DeviceBuffer<uint8_t> q(rows * cols);
  core::DeviceBuffer<float> scales(rows);
  GPULAB_CHECK(cudaMemset(q.get(), 0xFF, q.bytes()));
  GPULAB_CHECK(cudaMemset(scales.get(), 0xFF, scales.bytes()));
  run(q.get(), scales.get());
  GPULAB_CHECK(cudaDeviceSynchronize());
  Quantized out{std::vector<uint8_t>(rows * cols), std::vector<float>(rows)};
  GPULAB_CHECK(cudaMemcpy(out.bytes.data(), q.get(), q.bytes(), cudaMemcpyDeviceToHost));
  GPULAB_CHECK(cudaMemcpy(out.scales.data(), scales.get(), scales.bytes(), cudaMemcpyDeviceToHost));
  return out;
}

TEST(Fp8QuantGpu, FusedNormAndGateQuantizeAsTheTwoKernels) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(23);
  // Rows up to and past rmsnorm's cached length (8192), odd lengths (silu_mul_fp8 then loads one
  // element at a time), LLaMA-2-70B's 28672 (two of silu_mul_fp8's batches), a decode step's few rows.
  for (int64_t cols : {128, 4096, 5003, 8192, 11008, 13000, 28672})
    for (int64_t rows : {1, 16}) {
      for (DType dt : {DType::bf16, DType::f16}) {
        const std::string what = testing::dtype_label(dt) + " " + std::to_string(rows) + "x" + std::to_string(cols);
        for (DType in_dt : {DType::f32, DType::bf16}) {
          DeviceTensor x(testing::uniform(rows * cols, rng, -4, 4), in_dt);
          DeviceTensor w(testing::uniform(cols, rng, 0.5f, 1.5f), dt);
          auto normed = DeviceTensor::poisoned(rows * cols, dt);
          const Quantized two = quantized(rows, cols, [&](uint8_t* q, float* s) {
            rmsnorm(normed.get(), dt, x.get(), in_dt, w.get(), rows, cols, 1e-5f, nullptr);
            fp8_quantize(q, s, normed.get(), dt, rows, cols, Fp8Granularity::row, nullptr, nullptr);
          });
          const Quantized one = quantized(rows, cols, [&](uint8_t* q, float* s) {
            rmsnorm_fp8(q, s, dt, x.get(), in_dt, w.get(), rows, cols, 1e-5f, nullptr);
          });
          EXPECT_TRUE(one == two) << "rmsnorm_fp8 " << what << " from " << testing::dtype_label(in_dt);
        }
        DeviceTensor gate_up(testing::uniform(rows * 2 * cols, rng, -6, 6), dt);
        auto act = DeviceTensor::poisoned(rows * cols, dt);
        const Quantized two = quantized(rows, cols, [&](uint8_t* q, float* s) {
          silu_mul(act.get(), gate_up.get(), rows, cols, dt, nullptr);
          fp8_quantize(q, s, act.get(), dt, rows, cols, Fp8Granularity::row, nullptr, nullptr);
        });
        const Quantized one = quantized(rows, cols, [&](uint8_t* q, float* s) {
          silu_mul_fp8(q, s, gate_up.get(), rows, cols, dt, nullptr);
        });
        EXPECT_TRUE(one == two) << "silu_mul_fp8 " << what;
        // Not two untouched outputs: every byte written (0x7F / 0xFF, the poison, are e4m3 NaN).
        EXPECT_EQ(std::count_if(one.bytes.begin(), one.bytes.end(), [](uint8_t b) { return (b & 0x7F) == 0x7F; }), 0)
            << what;
        for (float scale : one.scales) EXPECT_GT(scale, 0.f) << what;
      }
    }
}

}  // namespace
}  // namespace gpulab::kernels
