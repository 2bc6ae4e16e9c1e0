// `gpulab bench llm --weights fp8 --prefill N` as a user runs it: the fp8 GEMM table printed, and
// its rows in the JSON beside bench gemm's own fp8 figure, each a fraction of it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/gpu.h"
#include "common/run_command.h"
#include "core/result.h"

namespace {

TEST(CliBenchLlm, Fp8PrefillGemmsBesideTheSuitesFigure) {
  GPULAB_REQUIRE_FP8();
  const std::filesystem::path json = std::filesystem::temp_directory_path() /
                                     ("gpulab_bench_llm_fp8_" + std::to_string(::getpid()) + ".json");
  const auto r = gpulab::testing::run_command(std::string(GPULAB_EXE) + " bench llm --config " GPULAB_TEST_DATA
                                              "/llama_tiny/config.json --dummy-weights --weights fp8 --batch 1 "
                                              "--input 4 --output 2 --prefill 64 --json " + json.string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::cout << r.out;
  EXPECT_NE(r.out.find("fp8 linear layers at 64 rows"), std::string::npos) << r.out;
  std::ifstream in(json);
  const nlohmann::json results = nlohmann::json::parse(in);
  std::filesystem::remove(json);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& row : results) {
    EXPECT_EQ(gpulab::core::validate_result(row), "") << row.dump();
    by_name[row["name"].get<std::string>()] = row;
  }
  ASSERT_TRUE(by_name.count("ceiling_cublaslt_fp8e4m3_rowwise_8192")) << results.dump(1);
  const double ceiling = by_name["ceiling_cublaslt_fp8e4m3_rowwise_8192"]["value"].get<double>();
  EXPECT_TRUE(std::isfinite(ceiling) && ceiling > 0) << ceiling;
  // llama_tiny: hidden 128, 4 heads and 2 KV heads of 32, intermediate 352.
  const std::map<std::string, std::pair<int64_t, int64_t>> shapes = {
      {"qkv", {256, 128}}, {"o_proj", {128, 128}}, {"gate_up", {704, 128}}, {"down", {128, 352}}};
  for (const auto& [layer, nk] : shapes) {
    const std::string name = "prefill_gemm_fp8_" + layer + "_m64";
    ASSERT_TRUE(by_name.count(name)) << name << " missing: " << results.dump(1);
    const nlohmann::json& row = by_name[name];
    EXPECT_NE(r.out.find(layer), std::string::npos) << r.out;
    EXPECT_EQ(row["unit"].get<std::string>(), "TFLOP/s");
    const double v = row["value"].get<double>();
    EXPECT_TRUE(std::isfinite(v) && v > 0) << row.dump();
    EXPECT_DOUBLE_EQ(row["peak"].get<double>(), ceiling) << row.dump();
    EXPECT_NEAR(row["fraction"].get<double>(), v / ceiling, 1e-12) << row.dump();
    const nlohmann::json& p = row["params"];
    EXPECT_EQ(p["m"].get<int64_t>(), 64) << row.dump();
    EXPECT_EQ(p["n"].get<int64_t>(), nk.first) << row.dump();
    EXPECT_EQ(p["k"].get<int64_t>(), nk.second) << row.dump();
    EXPECT_GT(p["median_ms"].get<double>(), 0) << row.dump();
    EXPECT_GT(p["autotuned_tflops"].get<double>(), 0) << row.dump();
  }
}

}  // namespace
