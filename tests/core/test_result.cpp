#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/result.h"

using namespace gpulab::core;
using nlohmann::json;

TEST(Result, ObjectFollowsSchema) {
  Result r{"gemm", "cublaslt_bf16_8192", "throughput", 790.0, "TFLOP/s", 989.0, {{"n", 8192}}};
  GpuStamp gpu{"NVIDIA H200", 1980, 3201, "580.159.03"};
  const json j = to_json(r, gpu);
  EXPECT_EQ(validate_result(j), "");
  EXPECT_EQ(j["schema"], 1);
  EXPECT_NEAR(j["fraction"].get<double>(), 790.0 / 989.0, 1e-12);
  EXPECT_EQ(j["gpu"]["sm_clock"], 1980);
  EXPECT_EQ(j["params"]["n"], 8192);
  EXPECT_EQ(j["time"].get<std::string>().size(), 20u);  // 2026-11-29T16:14:07Z
}

TEST(Result, NoPeakGivesNullFraction) {
  Result r{"launch", "empty_kernel", "latency", 4.2, "us", std::nullopt, {}};
  const json j = to_json(r, GpuStamp{});
  EXPECT_EQ(validate_result(j), "");
  EXPECT_TRUE(j["peak"].is_null());
  EXPECT_TRUE(j["fraction"].is_null());
  EXPECT_TRUE(j["gpu"]["sm_clock"].is_null());
}

TEST(Result, ValidatorCatchesBrokenObjects) {
  const json good = to_json(Result{"s", "n", "m", 1, "u", 2.0, {}}, GpuStamp{});
  for (const char* key : {"suite", "value", "params", "gpu", "fraction"}) {
    json bad = good;
    bad.erase(key);
    EXPECT_NE(validate_result(bad), "") << key;
  }
  json bad = good;
  bad["value"] = "fast";
  EXPECT_NE(validate_result(bad), "");
  bad = good;
  bad["schema"] = 2;
  EXPECT_NE(validate_result(bad), "");
}

TEST(Result, LogWritesAnArray) {
  ResultLog log(GpuStamp{"gpu", std::nullopt, std::nullopt, ""});
  log.add(Result{"a", "x", "m", 1, "u", std::nullopt, {}});
  log.add(Result{"a", "y", "m", 2, "u", 4.0, {}});
  const auto path = std::filesystem::temp_directory_path() / ("gpulab_results_" + std::to_string(::getpid()) + ".json");
  log.write(path);
  std::ifstream in(path);
  const json j = json::parse(in);
  std::filesystem::remove(path);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  for (const auto& r : j) EXPECT_EQ(validate_result(r), "");
  EXPECT_EQ(j[1]["fraction"], 0.5);
}
