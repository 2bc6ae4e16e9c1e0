// cuBLASLt through blas::Blas against a float64 CPU product, for every dtype and layout.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "blas/matmul.h"
#include "common/gpu.h"
#include "core/memory.h"

using namespace gpulab;
using core::DType;

namespace {

// Host bytes of `values` stored as dtype `dt` (values must be representable when exactness matters).
std::vector<uint8_t> encode(const std::vector<float>& values, DType dt) {
  std::vector<uint8_t> out(values.size() * core::dtype_size(dt));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dt) {
      case DType::f32: std::memcpy(&out[i * 4], &values[i], 4); break;
      case DType::f16: { uint16_t b = core::float_to_f16_bits(values[i]); std::memcpy(&out[i * 2], &b, 2); break; }
      case DType::bf16: { uint16_t b = core::float_to_bf16_bits(values[i]); std::memcpy(&out[i * 2], &b, 2); break; }
      case DType::f8e4m3: out[i] = core::float_to_f8e4m3_bits(values[i]); break;
      default: throw std::runtime_error("dtype not used in this test");
    }
  }
  return out;
}

struct Case {
  DType in, out;
  core::MathMode math;
  bool transpose_a, transpose_b;
  int64_t m, n, k;
};

std::string name_of(const Case& c) {
  return std::string(core::dtype_name(c.in)) + (c.math == core::MathMode::tf32 ? "(tf32)" : "") + "->" +
         std::string(core::dtype_name(c.out)) + (c.transpose_a ? " At" : "") + (c.transpose_b ? " Bt" : "") + " " +
         std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k);
}

void run_case(blas::Blas& blas, const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(name_of(c));
  // Integer values in [-2, 2]: every product and partial sum is exact in fp32 accumulation, and
  // the result (|sum| ≤ 4k) is exact in the output type for the k used here; tf32 keeps 10
  // mantissa bits, also exact for these inputs.
  std::uniform_int_distribution<int> dist(-2, 2);
  std::vector<float> a(c.m * c.k), b(c.k * c.n);
  for (auto& x : a) x = static_cast<float>(dist(rng));
  for (auto& x : b) x = static_cast<float>(dist(rng));
  auto a_at = [&](int64_t i, int64_t p) { return c.transpose_a ? a[p * c.m + i] : a[i * c.k + p]; };
  auto b_at = [&](int64_t p, int64_t j) { return c.transpose_b ? b[j * c.k + p] : b[p * c.n + j]; };
  const float scale_a = 0.5f, scale_b = 2.0f;  // fp8 only: exact powers of two
  const bool fp8 = c.in == DType::f8e4m3;

  const auto a_bytes = encode(a, c.in), b_bytes = encode(b, c.in);
  core::DeviceBuffer<uint8_t> da(a_bytes.size()), db(b_bytes.size()), dc(c.m * c.n * core::dtype_size(c.out));
  core::DeviceBuffer<float> scales(8);  // two scales 16 bytes apart (cuBLASLt's alignment)
  const float host_scales[8] = {scale_a, 0.f, 0.f, 0.f, scale_b, 0.f, 0.f, 0.f};
  GPULAB_CHECK(cudaMemcpy(da.get(), a_bytes.data(), a_bytes.size(), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(db.get(), b_bytes.data(), b_bytes.size(), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(scales.get(), host_scales, sizeof host_scales, cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemset(dc.get(), 0xFF, dc.bytes()));  // poison: NaN in every float type
  // The memset is asynchronous on the legacy stream, which the matmul's stream does not wait for.
  GPULAB_CHECK(cudaDeviceSynchronize());

  core::Stream stream;
  try {
    blas.matmul({c.m, c.n, c.k, c.transpose_a, c.transpose_b}, {c.in, c.in, c.out, c.math}, da.get(), db.get(),
              dc.get(), stream, 1.f, 0.f, fp8 ? blas::Fp8Scales{scales.get(), scales.get() + 4} : blas::Fp8Scales{});
    stream.synchronize();
  } catch (const core::Error& e) {
    FAIL() << e.what();
  }
  std::vector<uint8_t> out(dc.bytes());
  GPULAB_CHECK(cudaMemcpy(out.data(), dc.get(), out.size(), cudaMemcpyDeviceToHost));

  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double ref = 0;
      for (int64_t p = 0; p < c.k; ++p) ref += double(a_at(i, p)) * double(b_at(p, j));
      if (fp8) ref *= scale_a * scale_b;
      const double got = core::load_as_double(out.data(), c.out, i * c.n + j);
      ASSERT_EQ(got, ref) << "at (" << i << ", " << j << ")";
    }
  }
}

}  // namespace

TEST(BlasMatmul, EveryPrecisionAndLayoutIsExactOnIntegers) {
  GPULAB_REQUIRE_GPU();
  blas::Blas blas;
  std::mt19937 rng(7);
  using M = core::MathMode;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run_case(blas, {DType::f32, DType::f32, M::strict_fp32, ta, tb, 64, 48, 32}, rng);
      run_case(blas, {DType::f32, DType::f32, M::tf32, ta, tb, 128, 64, 96}, rng);
      run_case(blas, {DType::bf16, DType::bf16, M::strict_fp32, ta, tb, 96, 128, 16}, rng);
      run_case(blas, {DType::f16, DType::f32, M::strict_fp32, ta, tb, 64, 64, 64}, rng);
    }
  // Odd sizes: cuBLASLt falls back to lower-alignment kernels.
  run_case(blas, {DType::f32, DType::f32, M::strict_fp32, false, true, 37, 53, 29}, rng);
  run_case(blas, {DType::bf16, DType::f32, M::strict_fp32, false, true, 33, 17, 24}, rng);
  // fp8 e4m3 with per-tensor scales, bf16 out (the linear-layer layout cuBLASLt requires).
  run_case(blas, {DType::f8e4m3, DType::bf16, M::strict_fp32, false, true, 128, 128, 64}, rng);
  // The plan cache must give the same answer on reuse.
  run_case(blas, {DType::bf16, DType::bf16, M::strict_fp32, false, true, 96, 128, 16}, rng);
}

TEST(BlasMatmul, Fp8RefusesLayoutsCuBlasLtCannotRun) {
  GPULAB_REQUIRE_GPU();
  blas::Blas blas;
  core::Stream stream;
  core::DeviceBuffer<float> scales(8);
  // Scale pointers 4 bytes apart: cuBLASLt would answer NOT_SUPPORTED; we say why first.
  EXPECT_THROW(blas.matmul({16, 16, 16, false, true}, {DType::f8e4m3, DType::f8e4m3, DType::bf16}, nullptr,
                           nullptr, nullptr, stream, 1.f, 0.f, {scales.get(), scales.get() + 1}),
               core::Error);
  EXPECT_THROW(blas.matmul({16, 16, 16, false, false}, {DType::f8e4m3, DType::f8e4m3, DType::bf16}, nullptr,
                           nullptr, nullptr, stream),
               core::Error);
}

// Autotuned plans: every candidate ran on the operands before the fastest was kept; the answer
// must still be the exact one, and a cached tuned plan must give it again. k keeps every sum
// exact in the output type (|sum| ≤ 4k: 256 for bf16, 2048 for fp16).
TEST(BlasMatmul, AutotunedPlansAreExact) {
  GPULAB_REQUIRE_GPU();
  blas::Blas blas;
  blas.set_autotune(16);
  std::mt19937 rng(11);
  using M = core::MathMode;
  for (int rep = 0; rep < 2; ++rep) {  // the second pass reuses the tuned plans
    run_case(blas, {DType::bf16, DType::bf16, M::strict_fp32, false, false, 512, 512, 64}, rng);
    run_case(blas, {DType::f16, DType::f16, M::strict_fp32, false, false, 384, 256, 512}, rng);
    run_case(blas, {DType::f32, DType::f32, M::strict_fp32, false, false, 256, 256, 256}, rng);
    run_case(blas, {DType::f32, DType::f32, M::tf32, false, true, 256, 128, 512}, rng);
    run_case(blas, {DType::f8e4m3, DType::bf16, M::strict_fp32, false, true, 256, 256, 64}, rng);
    run_case(blas, {DType::bf16, DType::f32, M::strict_fp32, false, true, 33, 17, 24}, rng);
  }
}

// Tuning would overwrite C, so a plan first used with beta ≠ 0 is not tuned: C = A·B + C stays exact.
TEST(BlasMatmul, AutotuneKeepsAccumulatingCallsExact) {
  GPULAB_REQUIRE_GPU();
  blas::Blas blas;
  blas.set_autotune(16);
  const int64_t m = 128, n = 96, k = 64;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> dist(-2, 2);
  std::vector<float> a(m * k), b(k * n), c(m * n), out(m * n);
  for (auto* v : {&a, &b, &c})
    for (auto& x : *v) x = float(dist(rng));
  core::DeviceBuffer<float> da(a.size()), db(b.size()), dc(c.size());
  GPULAB_CHECK(cudaMemcpy(da.get(), a.data(), da.bytes(), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(db.get(), b.data(), db.bytes(), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(dc.get(), c.data(), dc.bytes(), cudaMemcpyHostToDevice));
  core::Stream stream;
  blas.matmul({m, n, k}, {DType::f32, DType::f32, DType::f32}, da.get(), db.get(), dc.get(), stream, 1.f, 1.f);
  stream.synchronize();
  GPULAB_CHECK(cudaMemcpy(out.data(), dc.get(), dc.bytes(), cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = c[i * n + j];
      for (int64_t p = 0; p < k; ++p) ref += double(a[i * k + p]) * b[p * n + j];
      ASSERT_EQ(out[i * n + j], ref) << "at (" << i << ", " << j << ")";
    }
}
