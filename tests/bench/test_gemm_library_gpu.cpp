// cuBLASLt through blas::Blas at every precision the gemm suite times, against the CPU
// reference: integer inputs in [-2, 2] (exact in fp8 e4m3 too), output poisoned first, every
// element checked. fp32/fp16/bf16 must equal the reference rounded through the output type;
// tf32 and fp8 within 1e-2 relative. Sizes include ones that are no multiple of any tile.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "bench/gemm_data.h"
#include "blas/matmul.h"
#include "common/gpu.h"
#include "core/dtype.h"
#include "core/memory.h"
#include "kernels/gemm_ladder.h"

using namespace gpulab;
using core::DType;

namespace {

std::vector<std::byte> encode(const std::vector<float>& v, DType dt) {
  std::vector<std::byte> out(v.size() * core::dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) switch (dt) {
      case DType::f32: std::memcpy(&out[i * 4], &v[i], 4); break;
      case DType::f16: { const uint16_t h = core::float_to_f16_bits(v[i]); std::memcpy(&out[i * 2], &h, 2); break; }
      case DType::bf16: { const uint16_t h = core::float_to_bf16_bits(v[i]); std::memcpy(&out[i * 2], &h, 2); break; }
      case DType::f8e4m3: out[i] = std::byte(core::float_to_f8e4m3_bits(v[i])); break;
      default: throw std::runtime_error("encode: unexpected dtype");
    }
  return out;
}

double round_through(DType dt, float x) {
  switch (dt) {
    case DType::f16: return core::f16_bits_to_float(core::float_to_f16_bits(x));
    case DType::bf16: return core::bf16_bits_to_float(core::float_to_bf16_bits(x));
    default: return x;
  }
}

void check(DType in, DType out, core::MathMode math, int m, int n, int k, double rtol) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> small(-2, 2);
  const bool fp8 = in == DType::f8e4m3;
  std::vector<float> a(size_t(m) * k), b(size_t(k) * n), ref(size_t(m) * n);
  for (auto& v : a) v = float(small(rng));
  for (auto& v : b) v = float(small(rng));
  kernels::gemm_reference(a.data(), b.data(), ref.data(), m, n, k);
  std::vector<float> b_stored = b;  // fp8 wants B as n×k
  if (fp8)
    for (int p = 0; p < k; ++p)
      for (int j = 0; j < n; ++j) b_stored[size_t(j) * k + p] = b[size_t(p) * n + j];
  const auto ha = encode(a, in), hb = encode(b_stored, in);
  core::DeviceBuffer<> da(ha.size()), db(hb.size()), dc(ref.size() * core::dtype_size(out));
  core::DeviceBuffer<float> scales(2);
  const float ones[2] = {1.f, 1.f};
  core::Stream stream;
  GPULAB_CHECK(cudaMemcpyAsync(da.get(), ha.data(), ha.size(), cudaMemcpyHostToDevice, stream));
  GPULAB_CHECK(cudaMemcpyAsync(db.get(), hb.data(), hb.size(), cudaMemcpyHostToDevice, stream));
  GPULAB_CHECK(cudaMemcpyAsync(scales.get(), ones, sizeof ones, cudaMemcpyHostToDevice, stream));
  GPULAB_CHECK(cudaMemsetAsync(dc.get(), 0xff, dc.bytes(), stream));
  blas::Blas blas;
  blas.matmul({m, n, k, false, fp8}, {in, in, out, math}, da.get(), db.get(), dc.get(), stream, 1.f, 0.f,
              fp8 ? blas::Fp8Scales{scales.get(), scales.get() + 1} : blas::Fp8Scales{});
  std::vector<std::byte> host(dc.bytes());
  GPULAB_CHECK(cudaMemcpyAsync(host.data(), dc.get(), dc.bytes(), cudaMemcpyDeviceToHost, stream));
  stream.synchronize();
  size_t wrong = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double got = core::load_as_double(host.data(), out, i), want = round_through(out, ref[i]);
    if (!(std::abs(got - want) <= rtol * std::abs(want) + (rtol > 0 ? 1e-2 : 0)) && wrong++ < 5)
      ADD_FAILURE() << core::dtype_name(in) << "->" << core::dtype_name(out) << " " << m << "x" << n << "x" << k << " C["
                    << i / n << "][" << i % n << "] = " << got << ", expected " << want;
  }
  EXPECT_EQ(wrong, 0u);
}

}  // namespace

TEST(GemmLibraryGpu, Fp32StrictExact) {
  GPULAB_REQUIRE_GPU();
  for (auto [m, n, k] : {std::tuple{64, 64, 64}, {123, 77, 301}, {256, 512, 1024}})
    check(DType::f32, DType::f32, core::MathMode::strict_fp32, m, n, k, 0);
}

TEST(GemmLibraryGpu, Tf32) {
  GPULAB_REQUIRE_GPU();
  for (auto [m, n, k] : {std::tuple{64, 64, 64}, {123, 77, 301}, {256, 512, 1024}})
    check(DType::f32, DType::f32, core::MathMode::tf32, m, n, k, 1e-3);
}

TEST(GemmLibraryGpu, Fp16Exact) {
  GPULAB_REQUIRE_GPU();
  for (auto [m, n, k] : {std::tuple{64, 64, 64}, {120, 72, 296}, {256, 512, 1024}})
    check(DType::f16, DType::f16, core::MathMode::strict_fp32, m, n, k, 0);
}

TEST(GemmLibraryGpu, Bf16Exact) {
  GPULAB_REQUIRE_GPU();
  for (auto [m, n, k] : {std::tuple{64, 64, 64}, {120, 72, 296}, {256, 512, 1024}})
    check(DType::bf16, DType::bf16, core::MathMode::strict_fp32, m, n, k, 0);
}

TEST(GemmLibraryGpu, Fp8E4m3WithScalesToBf16) {
  GPULAB_REQUIRE_GPU();
  // fp8 cuBLASLt wants k (and the leading dimensions) multiples of 16.
  for (auto [m, n, k] : {std::tuple{64, 64, 64}, {128, 96, 320}, {256, 512, 1024}})
    check(DType::f8e4m3, DType::bf16, core::MathMode::strict_fp32, m, n, k, 1e-2);
}

TEST(GemmDataGpu, FillIsSmallIntegersAndTransposeConsistent) {
  GPULAB_REQUIRE_GPU();
  const int rows = 67, cols = 45;
  core::DeviceBuffer<float> x(rows * cols), xt(rows * cols);
  core::Stream stream;
  bench::fill_integer_matrix(DType::f32, x.get(), rows, cols, false, 5, stream);
  bench::fill_integer_matrix(DType::f32, xt.get(), rows, cols, true, 5, stream);
  std::vector<float> h(rows * cols), ht(rows * cols);
  GPULAB_CHECK(cudaMemcpyAsync(h.data(), x.get(), x.bytes(), cudaMemcpyDeviceToHost, stream));
  GPULAB_CHECK(cudaMemcpyAsync(ht.data(), xt.get(), xt.bytes(), cudaMemcpyDeviceToHost, stream));
  stream.synchronize();
  int seen[5] = {};
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      const float v = h[i * cols + j];
      ASSERT_TRUE(v == std::floor(v) && v >= -2 && v <= 2) << v;
      ASSERT_EQ(v, ht[j * rows + i]);
      ++seen[int(v) + 2];
    }
  for (int s : seen) EXPECT_GT(s, 0);  // every value in [-2, 2] occurs: not a constant fill
}

TEST(GemmDataGpu, MismatchCountCatchesWrongNanAndRounding) {
  GPULAB_REQUIRE_GPU();
  const std::vector<float> ref = {1, 2, 3, 257, 5};
  std::vector<uint16_t> out;
  for (float v : ref) out.push_back(core::float_to_bf16_bits(v));  // 257 rounds to 256 in bf16: still right
  core::DeviceBuffer<float> dref(ref.size());
  core::DeviceBuffer<uint16_t> dout(out.size());
  core::Stream stream;
  GPULAB_CHECK(cudaMemcpy(dref.get(), ref.data(), ref.size() * 4, cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(dout.get(), out.data(), out.size() * 2, cudaMemcpyHostToDevice));
  EXPECT_EQ(bench::count_mismatches(DType::bf16, dout.get(), dref.get(), ref.size(), 0, 0, stream), 0u);
  out[1] = core::float_to_bf16_bits(2.5f);
  out[4] = 0x7fc0;  // NaN
  GPULAB_CHECK(cudaMemcpy(dout.get(), out.data(), out.size() * 2, cudaMemcpyHostToDevice));
  EXPECT_EQ(bench::count_mismatches(DType::bf16, dout.get(), dref.get(), ref.size(), 0, 0, stream), 2u);
  EXPECT_EQ(bench::count_mismatches(DType::bf16, dout.get(), dref.get(), ref.size(), 1.0, 0, stream), 1u);  // NaN still fails
}
