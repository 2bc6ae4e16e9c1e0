// `gpulab diagnose` as a user runs it, without a GPU: reading traces, writing reports, errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trace/chrome_trace.h"
#include "common/run_command.h"

using gpulab::testing::run_command;
namespace fs = std::filesystem;

namespace {

const std::string kGpulab = GPULAB_EXE;
const std::string kKineto = std::string(GPULAB_TEST_DATA) + "/traces/kineto_small.json";

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("gpulab_diagnose_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(DiagnoseCli, TraceFileGivesRankedReportJsonHtmlAndPerfettoTrace) {
  const fs::path dir = fresh_dir("report");
  const auto r = run_command(kGpulab + " diagnose --trace " + kKineto + " --json " + (dir / "f.json").string() +
                             " --html " + (dir / "r.html").string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("1. [high] host_starved"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fix:"), std::string::npos);

  std::ifstream in(dir / "f.json");
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["findings"].size(), 3u);
  EXPECT_EQ(j["findings"][0]["rule"], "host_starved");
  EXPECT_EQ(j["findings"][1]["rule"], "pageable_memcpy");
  EXPECT_EQ(j["findings"][2]["rule"], "low_occupancy");
  for (const auto& f : j["findings"])
    for (const char* key : {"rule", "severity", "time_lost_ms", "evidence", "fix"}) EXPECT_TRUE(f.contains(key)) << key;
  EXPECT_EQ(j["summary"]["kernels"], 3);

  std::ifstream html(dir / "r.html");
  const std::string page((std::istreambuf_iterator<char>(html)), {});
  EXPECT_NE(page.find("<svg"), std::string::npos);
  // The re-written trace reads back and analyses the same.
  const auto again = gpulab::trace::read_chrome_trace(dir / "out" / "trace.json");
  EXPECT_EQ(again.kernels.size(), 3u);
  EXPECT_EQ(again.devices.at(0).sm_count, 132);
  fs::remove_all(dir);
}

TEST(DiagnoseCli, ThresholdOverrideChangesFindings) {
  const auto r = run_command(kGpulab + " diagnose --trace " + kKineto +
                             " --threshold low_occupancy.min_share=0.5 --threshold host_starved.min_host_us=20000");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("low_occupancy"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("host_starved"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pageable_memcpy"), std::string::npos) << r.out;
}

TEST(DiagnoseCli, UserMistakesExitWithStatus2) {
  const fs::path dir = fresh_dir("bad");
  std::ofstream(dir / "bad.json") << "{\"traceEvents\": [";
  const auto bad = run_command(kGpulab + " diagnose --trace " + (dir / "bad.json").string());
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find((dir / "bad.json").string() + ": not valid JSON"), std::string::npos) << bad.out;
  EXPECT_EQ(run_command(kGpulab + " diagnose --trace " + kKineto + " --threshold nope.key=1").exit_code, 2);
  EXPECT_EQ(run_command(kGpulab + " diagnose --trace " + kKineto + " --threshold launch_bound.min_count=x").exit_code, 2);
  EXPECT_EQ(run_command(kGpulab + " diagnose").exit_code, 2);
  EXPECT_EQ(run_command(kGpulab + " diagnose --trace " + kKineto + " -- /bin/true").exit_code, 2);
  EXPECT_EQ(run_command(kGpulab + " diagnose --trace /nonexistent.json").exit_code, 2);
  fs::remove_all(dir);
}

TEST(DiagnoseCli, ProgramWithoutCudaWritesNoTrace) {
  const fs::path dir = fresh_dir("nocuda");
  const auto r = run_command(kGpulab + " diagnose --out " + dir.string() + " -- /bin/sh -c 'exit 0'");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("wrote no trace"), std::string::npos) << r.out;
  const auto failing = run_command(kGpulab + " diagnose --out " + dir.string() + " -- /bin/sh -c 'exit 7'");
  EXPECT_EQ(failing.exit_code, 7) << failing.out;  // the program's status wins over the missing trace
  EXPECT_NE(failing.out.find("wrote no trace"), std::string::npos) << failing.out;
  const auto missing = run_command(kGpulab + " diagnose --out " + dir.string() + " -- /nonexistent/program");
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_NE(missing.out.find("cannot run /nonexistent/program"), std::string::npos) << missing.out;
  fs::remove_all(dir);
}

// The run path without a GPU: a stand-in program checks the environment gpulab sets, writes two
// per-process traces where the injection library would, and exits with its own status.
TEST(DiagnoseCli, RunSetsInjectionEnvMergesProcessesAndPassesExitCode) {
  const fs::path dir = fresh_dir("run");
  const std::string script = "test -f \"$CUDA_INJECTION64_PATH\" || exit 90; "
                             "test \"$GPULAB_TRACE_DURATION\" = 2.500000 || exit 91; "
                             "cp " + kKineto + " \"$GPULAB_TRACE_DIR/process-1.json\"; "
                             // the second process runs 20 ms later
                             "sed 's/\"schemaVersion\": 1,/\"baseTimeNanoseconds\": 20000000,/' " + kKineto +
                             " > \"$GPULAB_TRACE_DIR/process-2.json\"; exit 5";
  std::ofstream(dir / "program.sh") << script;
  fs::create_directories(dir / "out");
  std::ofstream(dir / "out" / "process-999.json") << "stale";  // left by an earlier run
  const auto r = run_command(kGpulab + " diagnose --duration 2.5 --out " + (dir / "out").string() + " --json " +
                             (dir / "f.json").string() + " -- /bin/sh " + (dir / "program.sh").string());
  EXPECT_EQ(r.exit_code, 5) << r.out;
  std::ifstream in(dir / "f.json");
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["summary"]["kernels"], 6);
  ASSERT_FALSE(j["findings"].empty());
  EXPECT_EQ(j["findings"][0]["rule"], "host_starved");
  // One per process and one between them: found only if correlation ids are kept apart.
  EXPECT_EQ(j["findings"][0]["evidence"]["gaps"], 3);
  EXPECT_FALSE(fs::exists(dir / "out" / "process-999.json"));
  EXPECT_TRUE(fs::exists(dir / "out" / "trace.json"));
  fs::remove_all(dir);
}
