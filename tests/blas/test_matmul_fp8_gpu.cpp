// cuBLASLt fp8 with outer-vector scales (one per row of A, one per row of B stored n×k), the
// fp8 linear layers' GEMM: exact on integer inputs with power-of-two scales, every element.
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

// C = rowscale_a ⊗ colscale_b · (A·Bᵀ) (+ C when accumulating into float C).
void run_outer_vector_case(blas::Blas& blas, int64_t m, int64_t n, int64_t k, std::mt19937& rng,
                           DType out_type = DType::bf16, bool accumulate = false) {
  SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " -> " +
               std::string(core::dtype_name(out_type)) + (accumulate ? " accumulating" : ""));
  // Integers in [-2, 2] (|sum| ≤ 4k ≤ 256, exact in bf16, for the k ≤ 64 used here) times
  // powers of two: every product, sum and scaled result is exact in fp32 and in bf16.
  std::uniform_int_distribution<int> dist(-2, 2), expo(-3, 3);
  std::vector<uint8_t> a(m * k), b(n * k);
  std::vector<float> av(m * k), bv(n * k), sa(m), sb(n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = core::float_to_f8e4m3_bits(av[i] = float(dist(rng)));
  for (size_t i = 0; i < b.size(); ++i) b[i] = core::float_to_f8e4m3_bits(bv[i] = float(dist(rng)));
  for (auto& s : sa) s = std::ldexp(1.0f, expo(rng));
  for (auto& s : sb) s = std::ldexp(1.0f, expo(rng));
  core::DeviceBuffer<uint8_t> da(a.size()), db(b.size());
  core::DeviceBuffer<float> dsa(m), dsb(n);
  core::DeviceBuffer<uint8_t> dc(m * n * core::dtype_size(out_type));
  std::vector<float> c0(m * n, 0.0f);  // float C before an accumulating product: small integers
  for (auto& v : c0) v = accumulate ? float(dist(rng)) : 0.0f;
  GPULAB_CHECK(cudaMemcpy(da.get(), a.data(), a.size(), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(db.get(), b.data(), b.size(), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(dsa.get(), sa.data(), m * 4, cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(dsb.get(), sb.data(), n * 4, cudaMemcpyHostToDevice));
  if (accumulate)
    GPULAB_CHECK(cudaMemcpy(dc.get(), c0.data(), dc.bytes(), cudaMemcpyHostToDevice));
  else
    GPULAB_CHECK(cudaMemset(dc.get(), 0xFF, dc.bytes()));  // NaN
  GPULAB_CHECK(cudaDeviceSynchronize());  // the legacy-stream memset before the matmul's own stream
  core::Stream stream;
  blas.matmul({m, n, k, false, true}, {DType::f8e4m3, DType::f8e4m3, out_type}, da.get(), db.get(), dc.get(), stream,
              1.f, accumulate ? 1.f : 0.f, {dsa.get(), dsb.get(), true});
  stream.synchronize();
  std::vector<uint8_t> out(dc.bytes());
  GPULAB_CHECK(cudaMemcpy(out.data(), dc.get(), out.size(), cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0;
      for (int64_t p = 0; p < k; ++p) ref += double(av[i * k + p]) * bv[j * k + p];
      ref = ref * sa[i] * sb[j] + c0[i * n + j];
      ASSERT_EQ(core::load_as_double(out.data(), out_type, i * n + j), ref) << "at (" << i << ", " << j << ")";
    }
}

}  // namespace

// The decode (16 rows), single-row, odd-row and prefill-like shapes of the fp8 linear layers.
TEST(BlasMatmulFp8, OuterVectorScalesArePerRowOfAAndPerOutputColumn) {
  GPULAB_REQUIRE_GPU();
  blas::Blas blas;
  std::mt19937 rng(11);
  try {
    for (int64_t m : {1, 16, 37, 300}) run_outer_vector_case(blas, m, 128, 64, rng);
    run_outer_vector_case(blas, 16, 704, 32, rng);
    run_outer_vector_case(blas, 16, 256, 48, rng);  // the plan cache is keyed by the scaling too
  } catch (const core::Error& e) {
    FAIL() << e.what();
  }
}

// The engine's fp8 o_proj/down add into the float residual this way where cuBLASLt allows it
// (else they write bf16 and a kernel adds that): reported, and checked exactly where supported.
TEST(BlasMatmulFp8, OuterVectorScalesIntoAccumulatedFloat) {
  GPULAB_REQUIRE_GPU();
  blas::Blas blas;
  std::mt19937 rng(12);
  try {
    run_outer_vector_case(blas, 16, 128, 64, rng, DType::f32, true);
  } catch (const core::Error& e) {
    GTEST_SKIP() << "cuBLASLt refuses fp8 outer-vector scaling into float C with beta = 1: " << e.what();
  }
  run_outer_vector_case(blas, 300, 256, 64, rng, DType::f32, true);
  std::printf("cuBLASLt runs fp8 outer-vector scaling into float C with beta = 1\n");
}

TEST(BlasMatmulFp8, OuterVectorScalesNeedFp8Inputs) {
  GPULAB_REQUIRE_GPU();
  blas::Blas blas;
  core::Stream stream;
  core::DeviceBuffer<float> scales(64);
  EXPECT_THROW(blas.matmul({16, 16, 16, false, true}, {DType::bf16, DType::bf16, DType::bf16}, nullptr, nullptr,
                           nullptr, stream, 1.f, 0.f, {scales.get(), scales.get() + 16, true}),
               core::Error);
}
