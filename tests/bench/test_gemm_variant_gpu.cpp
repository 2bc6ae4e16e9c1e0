// measure_gemm_variant (bench llm's fp8 figure): one variant's row, as bench gemm writes it.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/suite.h"
#include "common/gpu.h"
#include "core/result.h"

using namespace gpulab;

TEST(GemmVariantGpu, Fp8RowwiseGivesTheSuitesVerifiedRow) {
  GPULAB_REQUIRE_FP8();
  // Under compute-sanitizer 512³ (the gemm suite's smallest there): the 16 autotuning candidates and
  // the timed repetitions at 1024³ took racecheck past 192 s (session 40); either size is verified.
  const int64_t n = sanitizer_tool().empty() ? 1024 : 512;
  const nlohmann::json r = bench::measure_gemm_variant("cublaslt_fp8e4m3_rowwise", n);
  EXPECT_EQ(core::validate_result(r), "") << r.dump();
  EXPECT_EQ(r["suite"].get<std::string>(), "gemm");
  EXPECT_EQ(r["name"].get<std::string>(), "cublaslt_fp8e4m3_rowwise_" + std::to_string(n));
  EXPECT_EQ(r["unit"].get<std::string>(), "TFLOP/s");
  const double v = r["value"].get<double>();
  EXPECT_TRUE(std::isfinite(v) && v > 0) << r.dump();
  EXPECT_EQ(r["params"]["input"].get<std::string>(), "fp8e4m3") << r.dump();
  EXPECT_EQ(r["params"]["verified"].get<std::string>(), "tolerance") << r.dump();
  EXPECT_EQ(r["params"]["m"].get<int64_t>(), n);
}
