#include <gtest/gtest.h>

#include <sstream>

#include "bench/report.h"
#include "bench/suite.h"
#include "common/run_command.h"
#include "core/error.h"
#include "core/result.h"

using namespace gpulab;
using namespace gpulab::bench;
using nlohmann::json;

namespace {

const json kAccelerators = json::parse(R"([
  {"name": "H200 SXM", "match": ["H200"], "fp16_tflops": 989, "bf16_tflops": 989, "tf32_tflops": 495,
   "fp8_tflops": 1979, "fp32_tflops": 67, "memory_tbps": 4.8, "tdp_watts": 700},
  {"name": "Other", "match": ["X1"], "fp16_tflops": null, "memory_tbps": null}])");

}  // namespace

TEST(Datasheet, MatchesByNameAndConvertsUnits) {
  const Datasheet d = datasheet_for(kAccelerators, "NVIDIA H200");
  EXPECT_EQ(d.name, "H200 SXM");
  EXPECT_DOUBLE_EQ(*d.memory_gbps, 4800);
  EXPECT_DOUBLE_EQ(*gemm_peak(d, "fp32"), 67);
  EXPECT_DOUBLE_EQ(*gemm_peak(d, "tf32"), 495);
  EXPECT_DOUBLE_EQ(*gemm_peak(d, "bf16"), 989);
  EXPECT_DOUBLE_EQ(*gemm_peak(d, "fp8e4m3"), 1979);
  EXPECT_FALSE(gemm_peak(d, "int4"));
  const Datasheet other = datasheet_for(kAccelerators, "X1 card");
  EXPECT_EQ(other.name, "Other");
  EXPECT_FALSE(other.fp16_tflops);
  EXPECT_FALSE(other.memory_gbps);
  EXPECT_EQ(datasheet_for(kAccelerators, "Unknown GPU").name, "");
}

TEST(Datasheet, BundledTableKnowsTheH200) {
  const Datasheet d = load_datasheet("NVIDIA H200");
  EXPECT_DOUBLE_EQ(*d.bf16_tflops, 989);
  EXPECT_DOUBLE_EQ(*d.fp8_tflops, 1979);
}

TEST(Report, RowsValidateAgainstTheResultSchema) {
  Row row = make_row("gemm", "cublaslt_bf16_8192", "throughput", "TFLOP/s", summarize({700, 710, 690}), 989.0, {{"m", 8192}});
  const json j = core::to_json(row.result, core::GpuStamp{"NVIDIA H200", 1980u, 3201u, "580"});
  EXPECT_EQ(core::validate_result(j), "") << j.dump();
  EXPECT_DOUBLE_EQ(j["value"].get<double>(), 700);
  EXPECT_NEAR(j["fraction"].get<double>(), 700.0 / 989, 1e-12);
  EXPECT_DOUBLE_EQ(j["params"]["p10"].get<double>(), 692);
  EXPECT_EQ(j["params"]["samples"], 3);
  EXPECT_EQ(j["params"]["m"], 8192);
  // Without a peak the fraction is null and the object still validates.
  Row lat = make_row("memory", "latency_l2", "latency", "ns", summarize({200}), std::nullopt);
  const json k = core::to_json(lat.result, core::GpuStamp{"NVIDIA H200", std::nullopt, std::nullopt, ""});
  EXPECT_EQ(core::validate_result(k), "") << k.dump();
  EXPECT_TRUE(k["fraction"].is_null());
}

TEST(Report, TableShowsPercentOfPeakAndCeiling) {
  Row row = make_row("memory", "hbm_copy_sm_kernel", "bandwidth", "GB/s", summarize({4000, 4100, 3900}), 4800.0);
  row.ceiling = 4000;
  Row bare = make_row("memory", "latency_hbm", "latency", "ns", summarize({612.5}), std::nullopt);
  std::ostringstream out;
  render_table(out, "memory", {row, bare}, {"a note"});
  const std::string s = out.str();
  EXPECT_NE(s.find("== memory =="), std::string::npos);
  EXPECT_NE(s.find("hbm_copy_sm_kernel"), std::string::npos);
  EXPECT_NE(s.find("83.3"), std::string::npos) << s;   // 4000 / 4800
  EXPECT_NE(s.find("100.0"), std::string::npos) << s;  // of the measured ceiling
  EXPECT_NE(s.find("3920.0 .. 4080.0"), std::string::npos) << s;
  EXPECT_NE(s.find("612.5"), std::string::npos) << s;
  EXPECT_NE(s.find("note: a note"), std::string::npos);
  EXPECT_EQ(percent_of(1, std::nullopt), "-");
  EXPECT_EQ(percent_of(1, 0.0), "-");
}

TEST(Suites, RegistryListsEverySuiteOnce) {
  std::vector<std::string> names;
  for (const auto& s : suites()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"memory", "transfer", "launch", "gemm", "decode", "um", "p2p", "nccl", "power"}));
  std::ostringstream out;
  print_suite_list(out);
  for (const auto& n : names) EXPECT_NE(out.str().find(n), std::string::npos);
}

TEST(Suites, SelectionKeepsRegistryOrderAndRejectsUnknownNames) {
  const auto picked = select_suites({"gemm", "memory"});
  ASSERT_EQ(picked.size(), 2u);
  EXPECT_EQ(picked[0]->name, "memory");
  EXPECT_EQ(picked[1]->name, "gemm");
  EXPECT_EQ(select_suites({}).size(), suites().size());
  EXPECT_THROW(select_suites({"gemm", "nosuch"}), core::InputError);
}

namespace {

gpulab::testing::CommandResult run_cli(const std::string& args) {
  return gpulab::testing::run_command(std::string(GPULAB_EXE) + " " + args);
}

}  // namespace

TEST(BenchCli, ListNeedsNoGpu) {
  const auto r = run_cli("bench --list");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* s : {"memory", "transfer", "launch", "gemm", "decode", "um", "p2p", "nccl", "power"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST(BenchCli, UnknownSuiteIsAUsageError) {
  const auto r = run_cli("bench nosuch");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("nosuch"), std::string::npos);
}

TEST(BenchCli, WithoutAGpuExits3WithAClearMessage) {
  if (core::why_no_device().empty()) GTEST_SKIP() << "a GPU is visible; this test is for machines without one";
  const auto r = run_cli("bench --quick memory");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("gpulab:"), std::string::npos) << r.out;
}
