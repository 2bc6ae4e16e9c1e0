// Every GEMM ladder step against the CPU reference: integer inputs in [-2, 2] make every
// product and partial sum exact in fp32, so the check is equality on every element. Fresh random
// inputs each run; the output is poisoned (NaN) first, so an unwritten element fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "common/gpu.h"
#include "core/dtype.h"
#include "core/memory.h"
#include "kernels/gemm_ladder.h"

using namespace gpulab;
using namespace gpulab::kernels;

namespace {

struct Case {
  GemmStep step;
  core::DType input;
  int m, n, k;
};

std::vector<std::byte> encode(const std::vector<float>& v, core::DType dt) {
  std::vector<std::byte> out(v.size() * core::dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == core::DType::f32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const uint16_t bits = dt == core::DType::bf16 ? core::float_to_bf16_bits(v[i]) : core::float_to_f16_bits(v[i]);
      std::memcpy(&out[i * 2], &bits, 2);
    }
  }
  return out;
}

void check_case(const Case& c) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> small(-2, 2);
  std::vector<float> a(size_t(c.m) * c.k), b(size_t(c.k) * c.n), ref(size_t(c.m) * c.n), out(ref.size());
  for (auto& v : a) v = float(small(rng));
  for (auto& v : b) v = float(small(rng));
  gemm_reference(a.data(), b.data(), ref.data(), c.m, c.n, c.k);

  std::vector<float> b_stored = b;
  if (gemm_step_b_transposed(c.step))
    for (int p = 0; p < c.k; ++p)
      for (int j = 0; j < c.n; ++j) b_stored[size_t(j) * c.k + p] = b[size_t(p) * c.n + j];
  const auto ha = encode(a, c.input), hb = encode(b_stored, c.input);
  core::DeviceBuffer<> da(ha.size()), db(hb.size());
  core::DeviceBuffer<float> dc(ref.size());
  core::Stream stream;
  GPULAB_CHECK(cudaMemcpyAsync(da.get(), ha.data(), ha.size(), cudaMemcpyHostToDevice, stream));
  GPULAB_CHECK(cudaMemcpyAsync(db.get(), hb.data(), hb.size(), cudaMemcpyHostToDevice, stream));
  GPULAB_CHECK(cudaMemsetAsync(dc.get(), 0xff, dc.bytes(), stream));  // NaN everywhere
  gemm_ladder(c.step, c.input, da.get(), db.get(), dc.get(), c.m, c.n, c.k, stream);
  GPULAB_CHECK(cudaMemcpyAsync(out.data(), dc.get(), dc.bytes(), cudaMemcpyDeviceToHost, stream));
  stream.synchronize();
  size_t wrong = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(out[i] == ref[i]) && wrong++ < 5)
      ADD_FAILURE() << gemm_step_name(c.step) << " " << core::dtype_name(c.input) << " " << c.m << "x" << c.n << "x" << c.k
                    << ": C[" << i / c.n << "][" << i % c.n << "] = " << out[i] << ", expected " << ref[i];
  EXPECT_EQ(wrong, 0u) << gemm_step_name(c.step) << " " << c.m << "x" << c.n << "x" << c.k;
}

void check_step(GemmStep step, core::DType input, std::initializer_list<std::tuple<int, int, int>> sizes) {
  if (!gemm_step_available(step)) GTEST_SKIP() << gemm_step_name(step) << " is not available on this device/build";
  for (auto [m, n, k] : sizes) {
    ASSERT_EQ(gemm_step_size_rule(step, m, n, k), "");
    check_case({step, input, m, n, k});
  }
}

}  // namespace

TEST(GemmLadderGpu, NaiveAnySize) {
  GPULAB_REQUIRE_GPU();
  check_step(GemmStep::naive, core::DType::f32, {{1, 1, 1}, {37, 53, 29}, {130, 70, 257}, {256, 256, 256}});
}

TEST(GemmLadderGpu, SmemTiledAnySize) {
  GPULAB_REQUIRE_GPU();
  check_step(GemmStep::smem_tiled, core::DType::f32, {{1, 1, 1}, {37, 53, 29}, {130, 70, 257}, {256, 256, 256}});
}

TEST(GemmLadderGpu, RegisterBlockedTileMultiples) {
  GPULAB_REQUIRE_GPU();
  check_step(GemmStep::register_blocked, core::DType::f32, {{128, 128, 8}, {256, 384, 264}, {512, 256, 1000}});
}

// mma_sync (128×256×64 block tiles, a 3-stage ring, fragments loaded one k-step ahead, blocks
// rastered in groups of 8 block rows): k = 64 is one k-tile (the prologue fills fewer stages than
// it has), 128 exactly the prologue's 2, 192 the whole ring; 1024 and 4096 wrap the ring many
// times. 1408 = 11 block rows is a full raster group and a partial one of 3; 2176 = 17 rows two
// full groups and one of a single row; 384×768 is a 3×3 grid.
const std::initializer_list<std::tuple<int, int, int>> kMmaSizes = {
    {128, 256, 64}, {256, 512, 128}, {256, 512, 192}, {384, 768, 1024}, {1408, 768, 320}, {2176, 512, 64}, {256, 256, 4096}};

TEST(GemmLadderGpu, MmaSyncBf16) {
  GPULAB_REQUIRE_GPU();
  check_step(GemmStep::mma_sync, core::DType::bf16, kMmaSizes);
}

TEST(GemmLadderGpu, MmaSyncFp16) {
  GPULAB_REQUIRE_GPU();
  check_step(GemmStep::mma_sync, core::DType::f16, kMmaSizes);
}

TEST(GemmLadderGpu, WgmmaBf16) {
  GPULAB_REQUIRE_GPU();
  check_step(GemmStep::wgmma, core::DType::bf16, {{128, 256, 64}, {256, 512, 192}, {384, 768, 1024}, {1024, 1024, 4096}});
}
