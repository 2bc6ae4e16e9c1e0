// CPU checks of the GEMM ladder's contract: the reference, and the size and dtype rules that
// reject what a step cannot do before anything touches a GPU.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "kernels/gemm_ladder.h"

using namespace gpulab;
using namespace gpulab::kernels;

TEST(GemmReference, MatchesAHandComputedProduct) {
  // [1 2 3; 4 5 6] · [7 8; 9 10; 11 12] = [58 64; 139 154]
  const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10, 11, 12};
  float c[4] = {};
  gemm_reference(a, b, c, 2, 2, 3);
  EXPECT_EQ(c[0], 58);
  EXPECT_EQ(c[1], 64);
  EXPECT_EQ(c[2], 139);
  EXPECT_EQ(c[3], 154);
}

TEST(GemmReference, AgreesWithATripleLoopOnRandomShapes) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-1, 1);
  const int m = 37, n = 19, k = 53;
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (auto& v : a) v = u(rng);
  for (auto& v : b) v = u(rng);
  gemm_reference(a.data(), b.data(), c.data(), m, n, k);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) s += double(a[i * k + p]) * b[p * n + j];
      ASSERT_EQ(c[i * n + j], float(s)) << i << "," << j;
    }
}

TEST(GemmLadder, SizeRulesNameTheTile) {
  EXPECT_EQ(gemm_step_size_rule(GemmStep::naive, 7, 13, 5), "");
  EXPECT_EQ(gemm_step_size_rule(GemmStep::smem_tiled, 1, 1, 1), "");
  EXPECT_EQ(gemm_step_size_rule(GemmStep::register_blocked, 256, 128, 8), "");
  EXPECT_NE(gemm_step_size_rule(GemmStep::register_blocked, 100, 128, 8).find("multiple of 128"), std::string::npos);
  EXPECT_NE(gemm_step_size_rule(GemmStep::mma_sync, 128, 256, 40), "");
  EXPECT_NE(gemm_step_size_rule(GemmStep::mma_sync, 128, 128, 32).find("n of 256"), std::string::npos);
  EXPECT_NE(gemm_step_size_rule(GemmStep::mma_sync, 128, 256, 32).find("k of 64"), std::string::npos);
  EXPECT_EQ(gemm_step_size_rule(GemmStep::mma_sync, 128, 256, 64), "");
  EXPECT_EQ(gemm_step_size_rule(GemmStep::wgmma, 128, 256, 64), "");
  EXPECT_NE(gemm_step_size_rule(GemmStep::wgmma, 128, 128, 64), "");
  EXPECT_NE(gemm_step_size_rule(GemmStep::naive, 0, 1, 1), "");
}

TEST(GemmLadder, RejectsBadSizesAndDtypesBeforeLaunching) {
  // Null pointers: the checks must throw before any kernel could read them.
  EXPECT_THROW(gemm_ladder(GemmStep::register_blocked, core::DType::f32, nullptr, nullptr, nullptr, 100, 128, 8, nullptr), core::InputError);
  EXPECT_THROW(gemm_ladder(GemmStep::mma_sync, core::DType::f32, nullptr, nullptr, nullptr, 128, 256, 32, nullptr), core::InputError);
  EXPECT_THROW(gemm_ladder(GemmStep::mma_sync, core::DType::bf16, nullptr, nullptr, nullptr, 128, 128, 32, nullptr), core::InputError);
  EXPECT_THROW(gemm_ladder(GemmStep::naive, core::DType::bf16, nullptr, nullptr, nullptr, 16, 16, 16, nullptr), core::InputError);
  EXPECT_THROW(gemm_ladder(GemmStep::wgmma, core::DType::f16, nullptr, nullptr, nullptr, 128, 256, 64, nullptr), core::InputError);
  EXPECT_TRUE(gemm_step_supports(GemmStep::mma_sync, core::DType::f16));
  EXPECT_TRUE(gemm_step_supports(GemmStep::mma_sync, core::DType::bf16));
  EXPECT_TRUE(gemm_step_supports(GemmStep::wgmma, core::DType::bf16));
  EXPECT_FALSE(gemm_step_supports(GemmStep::register_blocked, core::DType::bf16));
}
