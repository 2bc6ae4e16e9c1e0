// bench llm's fp8 prefill GEMM table on a GPU: every linear layer of the engine timed with the
// engine's call, each figure finite, positive and consistent with its shape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "common/gpu.h"
#include "llm/bench_llm.h"
#include "llm/fixtures.h"

namespace gpulab::llm {
namespace {

void expect_table(const LlamaConfig& c, int64_t m) {
  const std::vector<LinearShape> shapes = fp8_linear_shapes(c);
  const std::vector<LinearGemmFigures> got = time_fp8_linears(c, m);
  ASSERT_EQ(got.size(), shapes.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const LinearGemmFigures& f = got[i];
    const std::string& name = f.shape.name;
    EXPECT_EQ(name, shapes[i].name);
    EXPECT_EQ(f.shape.n, shapes[i].n) << name;
    EXPECT_EQ(f.shape.k, shapes[i].k) << name;
    EXPECT_EQ(f.m, m) << name;
    EXPECT_TRUE(std::isfinite(f.ms) && f.ms > 0) << name << ": " << f.ms;
    EXPECT_TRUE(std::isfinite(f.flop_per_s) && f.flop_per_s > 0) << name << ": " << f.flop_per_s;
    EXPECT_TRUE(std::isfinite(f.autotuned_flop_per_s) && f.autotuned_flop_per_s > 0) << name;
    EXPECT_NEAR(f.flop_per_s * f.ms * 1e-3, 2.0 * m * f.shape.n * f.shape.k, 1e-6 * 2.0 * m * f.shape.n * f.shape.k) << name;
    if (f.shape.into_residual) {  // f32 += where cuBLASLt takes it, else bf16 as the engine falls back
      EXPECT_TRUE((f.output == core::DType::f32 && f.beta == 1.f) || (f.output == core::DType::bf16 && f.beta == 0.f)) << name;
    } else {
      EXPECT_EQ(f.output, core::DType::bf16) << name;
      EXPECT_EQ(f.beta, 0.f) << name;
    }
    std::printf("%-8s m=%-5lld n=%-6lld k=%-6lld %s %8.3f ms %8.1f TFLOP/s (autotuned %8.1f)\n", name.c_str(),
                static_cast<long long>(m), static_cast<long long>(f.shape.n), static_cast<long long>(f.shape.k),
                std::string(core::dtype_name(f.output)).c_str(), f.ms, f.flop_per_s / 1e12, f.autotuned_flop_per_s / 1e12);
  }
}

TEST(BenchLlmGemmsGpu, TinyModelTableAtPrefillRows) {
  GPULAB_REQUIRE_FP8();
  expect_table(read_model_config(testing::fixture_dir("llama_tiny")), 64);
}

// A real model's shapes at a prompt's rows that no 128-row tile divides (well under a second).
// Under a sanitizer 136 rows, one tile and a partial one, instead of 1000: racecheck cut the
// autotuned table at 480 s (session 32).
TEST(BenchLlmGemmsGpu, Llama2_7bTableAtPrefillRows) {
  GPULAB_REQUIRE_FP8();
  expect_table(builtin_config("llama2-7b"), sanitizer_tool().empty() ? 1000 : 136);
}

}  // namespace
}  // namespace gpulab::llm
