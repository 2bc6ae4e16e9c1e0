// `gpulab diagnose -- example_<rule>` on a real GPU: each example's planted pathology is the top
// finding, the healthy example has nothing high, and the collected trace holds what ran.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/gpu.h"
#include "trace/chrome_trace.h"
#include "common/run_command.h"

using gpulab::testing::run_command;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kGpulab = GPULAB_EXE;

std::string example(const std::string& name) { return std::string(GPULAB_EXAMPLES_DIR) + "/example_" + name; }

struct Diagnosis {
  int exit_code;
  std::string out;
  json report;
  gpulab::trace::Trace trace;
};

// Runs `gpulab diagnose [extra] -- command` in a fresh folder and reads back what it wrote. The
// runs take a lock so that parallel ctest jobs do not share the GPU and blur each other's timing.
Diagnosis diagnose(const std::string& tag, const std::string& command, const std::string& extra = "") {
  const int lock = open((fs::temp_directory_path() / "gpulab_diagnose_gpu.lock").c_str(), O_CREAT | O_RDWR, 0666);
  if (lock >= 0) flock(lock, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() {
      if (fd >= 0) close(fd);  // closing releases the lock
    }
  } unlock{lock};
  const fs::path dir = fs::temp_directory_path() / ("gpulab_diagnose_gpu_" + std::to_string(getpid()) + "_" + tag);
  fs::remove_all(dir);
  const auto r = run_command(kGpulab + " diagnose --out " + dir.string() + " --json " + (dir / "f.json").string() + " " +
                             extra + " -- " + command);
  Diagnosis d{r.exit_code, r.out, json(), {}};
  if (fs::exists(dir / "f.json")) {
    std::ifstream in(dir / "f.json");
    d.report = json::parse(in);
  }
  if (fs::exists(dir / "trace.json")) d.trace = gpulab::trace::read_chrome_trace(dir / "trace.json");
  fs::remove_all(dir);
  return d;
}

std::string rules(const json& report) {
  std::string s;
  for (const auto& f : report["findings"])
    s += f["rule"].get<std::string>() + "/" + f["severity"].get<std::string>() + "/" + f["time_lost_ms"].dump() + " ";
  return s;
}

// What the rules saw around the first idle gaps: each gap (us, from the trace's first GPU work) and
// the API calls that overlap it or began up to 100 us before it, with times relative to the gap's
// start. Printed when an attribution test fails, so one run tells why a gap went unexplained.
std::string gap_context(const gpulab::trace::Trace& t, size_t max_gaps = 4) {
  std::vector<std::pair<int64_t, int64_t>> work;
  for (const auto& k : t.kernels) work.emplace_back(k.start_ns, k.end_ns);
  for (const auto& m : t.memcpys) work.emplace_back(m.start_ns, m.end_ns);
  for (const auto& m : t.memsets) work.emplace_back(m.start_ns, m.end_ns);
  std::sort(work.begin(), work.end());
  if (work.empty()) return "no GPU work in the trace\n";
  const int64_t origin = work.front().first;
  std::ostringstream out;
  int64_t busy_end = work.front().second, idle = 0;
  size_t gaps = 0;
  for (size_t i = 1; i < work.size(); ++i) {
    if (work[i].first > busy_end) {
      const int64_t gap_start = busy_end, gap_end = work[i].first;
      idle += gap_end - gap_start;
      if (gaps++ < max_gaps) {
        out << "gap " << (gap_start - origin) / 1000.0 << " .. " << (gap_end - origin) / 1000.0 << " us:";
        for (const auto& c : t.api_calls)
          if (c.end_ns > gap_start - 100'000 && c.start_ns < gap_end)
            out << " " << c.name << (c.driver ? "[drv]" : "") << "@t" << c.thread << "("
                << (c.start_ns - gap_start) / 1000.0 << ".." << (c.end_ns - gap_start) / 1000.0 << ")";
        out << "\n";
      }
    }
    busy_end = std::max(busy_end, work[i].second);
  }
  out << gaps << " gaps, " << idle / 1e6 << " ms idle in total\n";
  return out.str();
}

// compute-sanitizer may hold the traced program's one CUPTI subscription itself (racecheck does on
// driver 580), so that the tracer cannot start: the program then runs under the tool untraced and
// diagnose says so. All such a run can show is that the program ran to its end with
// `expected_exit`; the trace is judged in the plain run and wherever the tracer can start.
bool untraced_under_sanitizer(const Diagnosis& d, int expected_exit = 0) {
  if (sanitizer_tool().empty() || d.out.find("another CUPTI tool holds this process") == std::string::npos)
    return false;
  EXPECT_NE(d.out.find("wrote no trace (exit status " + std::to_string(expected_exit) + ")"), std::string::npos)
      << d.out;
  std::printf("the tracer could not start beside %s: the program ran untraced\n", sanitizer_tool().c_str());
  return true;
}

}  // namespace

class DiagnoseExample : public ::testing::TestWithParam<const char*> {};

TEST_P(DiagnoseExample, PlantedRuleIsTheTopFinding) {
  GPULAB_REQUIRE_GPU();
  const std::string rule = GetParam();
  const Diagnosis d = diagnose(rule, example(rule));
  if (untraced_under_sanitizer(d)) return;
  ASSERT_EQ(d.exit_code, 0) << d.out;
  ASSERT_TRUE(d.report.contains("findings")) << d.out;
  // A sanitizer slows the example's kernels 10-100x, which changes what its timeline shows (a
  // launch-bound loop is kernel-bound there): the ranking is judged only outside one.
  if (sanitizer_tool().empty()) {
    ASSERT_FALSE(d.report["findings"].empty()) << d.out << gap_context(d.trace);
    EXPECT_EQ(d.report["findings"][0]["rule"], rule)
        << rules(d.report) << "\n" << d.report["findings"].dump(1) << "\n" << d.out << gap_context(d.trace);
    EXPECT_NE(d.report["findings"][0]["severity"], "low") << rules(d.report);
  }
  EXPECT_EQ(d.report["summary"]["dropped_records"], 0);
  EXPECT_GT(d.report["summary"]["nvml_samples"].get<int>(), 0) << "NVML sampler recorded nothing";
  EXPECT_EQ(d.trace.kernels.size(), d.report["summary"]["kernels"].get<size_t>());
}

INSTANTIATE_TEST_SUITE_P(Examples, DiagnoseExample,
                         ::testing::Values("launch_bound", "pageable_memcpy", "sync_api", "host_starved",
                                           "um_thrashing", "pcie_saturation"),
                         [](const auto& info) { return std::string(info.param); });

TEST(DiagnoseExamples, HealthyHasNothingHigh) {
  GPULAB_REQUIRE_GPU();
  const Diagnosis d = diagnose("healthy", example("healthy"));
  if (untraced_under_sanitizer(d)) return;
  ASSERT_EQ(d.exit_code, 0) << d.out;
  for (const auto& f : d.report["findings"]) EXPECT_NE(f["severity"], "high") << rules(d.report);
  EXPECT_GT(d.report["summary"]["gpu_busy_percent"].get<double>(), 95.0) << d.out;
  EXPECT_EQ(d.report["summary"]["kernels"], 100);
}

TEST(DiagnoseExamples, TraceHoldsKernelsLaunchesAndDevice) {
  GPULAB_REQUIRE_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const Diagnosis d = diagnose("launch_trace", example("launch_bound"));
  if (untraced_under_sanitizer(d)) return;
  ASSERT_EQ(d.exit_code, 0) << d.out;
  const auto& t = d.trace;
  ASSERT_EQ(t.kernels.size(), 20000u);
  // CUPTI documents the kernel's correlation id as the runtime's or the driver's launch call.
  std::map<int64_t, const gpulab::trace::ApiCall*> launches;
  int runtime_launches = 0;
  for (const auto& c : t.api_calls) {
    if (c.name.find("LaunchKernel") != std::string::npos) launches[c.correlation] = &c;
    runtime_launches += c.name == "cudaLaunchKernel";
  }
  EXPECT_EQ(runtime_launches, 20000);
  for (const auto& k : t.kernels) {
    ASSERT_NE(k.name.find("axpy"), std::string::npos) << k.name;  // demangled: "axpy(int, float, ...)"
    ASSERT_EQ(k.grid[0], 2 * sms);
    ASSERT_EQ(k.block[0], 256);
    ASSERT_GT(k.end_ns, k.start_ns);
    const auto l = launches.find(k.correlation);
    ASSERT_NE(l, launches.end()) << "kernel without its launch, correlation " << k.correlation;
    ASSERT_LE(l->second->start_ns, k.start_ns);
  }
  ASSERT_EQ(t.devices.count(0), 1u);
  EXPECT_EQ(t.devices.at(0).sm_count, sms);
  EXPECT_GT(t.devices.at(0).pcie_gbps(), 0) << "NVML gave no PCIe link";
  EXPECT_FALSE(t.samples.empty());
}

TEST(DiagnoseExamples, CopiesCarryMemoryKinds) {
  GPULAB_REQUIRE_GPU();
  const Diagnosis d = diagnose("pageable_trace", example("pageable_memcpy"));
  if (untraced_under_sanitizer(d)) return;
  ASSERT_EQ(d.exit_code, 0) << d.out;
  // CUPTI may report a staged copy as one record or as chunks: count bytes per direction.
  int64_t h2d = 0, d2h = 0;
  for (const auto& m : d.trace.memcpys) {
    if (m.kind == gpulab::trace::CopyKind::htod) {
      h2d += m.bytes;
      EXPECT_EQ(m.src, gpulab::trace::MemoryKind::pageable);
      EXPECT_EQ(m.dst, gpulab::trace::MemoryKind::device);
    } else if (m.kind == gpulab::trace::CopyKind::dtoh) {
      d2h += m.bytes;
      EXPECT_EQ(m.src, gpulab::trace::MemoryKind::device);
      EXPECT_EQ(m.dst, gpulab::trace::MemoryKind::pageable);
    }
  }
  EXPECT_EQ(h2d, 30ll << 26);
  EXPECT_EQ(d2h, 30ll << 26);
}

TEST(DiagnoseExamples, UnifiedMemoryCountersRecordMigrations) {
  GPULAB_REQUIRE_GPU();
  const Diagnosis d = diagnose("um_trace", example("um_thrashing"));
  if (untraced_under_sanitizer(d)) return;
  ASSERT_EQ(d.exit_code, 0) << d.out;
  ASSERT_TRUE(d.trace.um_counters_enabled) << "CUPTI refused unified-memory counters on this system";
  int64_t htod = 0, dtoh = 0;
  for (const auto& e : d.trace.um_events) {
    if (e.kind == gpulab::trace::UmKind::htod_migration) htod += e.value;
    if (e.kind == gpulab::trace::UmKind::dtoh_migration) dtoh += e.value;
  }
  // Each of the 12 steps moves the 32 MiB back to the GPU (allow for half, whatever the chunking).
  EXPECT_GE(htod, 6ll * (32 << 20)) << htod;
  EXPECT_GT(dtoh, 0);
}

TEST(DiagnoseExamples, ExitCodePassesThrough) {
  GPULAB_REQUIRE_GPU();
  const Diagnosis d = diagnose("exit", "/bin/sh -c '" + example("healthy") + " && exit 3'");
  EXPECT_EQ(d.exit_code, 3) << d.out;
  if (untraced_under_sanitizer(d, 3)) return;
  EXPECT_EQ(d.report["summary"]["kernels"], 100) << d.out;  // the child of the shell was traced
}

TEST(DiagnoseExamples, DurationStopsTracingEarly) {
  GPULAB_REQUIRE_GPU();
  // 400 kernels of 5 ms take 2 s after CUDA start-up; tracing stops 1 s after cuInit. All 400
  // launches are queued at once, so the records of kernels still waiting at the deadline reach
  // the final (forced) flush: they must be left out, not kept with zero timestamps.
  const Diagnosis d = diagnose("duration", example("healthy") + " 400", "--duration 1");
  if (untraced_under_sanitizer(d)) return;
  ASSERT_EQ(d.exit_code, 0) << d.out;
  const size_t kernels = d.report["summary"]["kernels"].get<size_t>();
  int64_t first = INT64_MAX, last = 0, zero = 0;
  for (const auto& k : d.trace.kernels) {
    if (k.start_ns <= 0 || k.end_ns <= k.start_ns) ++zero;
    first = std::min(first, k.start_ns);
    last = std::max(last, k.end_ns);
  }
  const std::string seen = std::to_string(kernels) + " kernels, " + std::to_string(zero) +
                           " without valid timestamps, first start " + std::to_string(first) + " ns, kernels span " +
                           std::to_string((last - first) / 1e6) + " ms\n" + d.out;
  EXPECT_EQ(zero, 0) << seen;
  EXPECT_GT(kernels, 0u) << seen;
  EXPECT_LT(kernels, 400u) << seen;
  // Those kept ran inside the 1 s window (plus one 50 ms sampling step); all 400 would take 2 s.
  EXPECT_LT(d.report["summary"]["span_ms"].get<double>(), 1500.0) << seen;
  EXPECT_EQ(d.trace.kernels.size(), kernels) << seen;
}

// NVTX reaches the trace: NVTX_INJECTION64_PATH -> the injection library -> CUPTI's marker records.
TEST(DiagnoseNvtx, RangesOfTheProgramComeBackAndDefineTheWindow) {
  GPULAB_REQUIRE_GPU();
  const Diagnosis d = diagnose("nvtx", example("healthy"), "--capture-range healthy:kernels");
  if (untraced_under_sanitizer(d)) return;
  ASSERT_EQ(d.exit_code, 0) << d.out;
  const auto& t = d.trace;
  std::vector<const gpulab::trace::NvtxRange*> outer, launch_ranges;
  for (const auto& r : t.ranges) {
    EXPECT_FALSE(r.gpu);
    EXPECT_TRUE(r.domain.empty()) << r.domain;
    EXPECT_GT(r.end_ns, r.start_ns) << r.name;
    if (r.name == "healthy:kernels") outer.push_back(&r);
    else if (r.name == "launch") launch_ranges.push_back(&r);
    else ADD_FAILURE() << "unexpected range " << r.name;
  }
  ASSERT_EQ(outer.size(), 1u) << t.ranges.size() << " ranges\n" << d.out;
  ASSERT_EQ(launch_ranges.size(), 100u);
  // Each "launch" range holds exactly one cudaLaunchKernel of its thread: one clock, one thread id.
  std::vector<const gpulab::trace::ApiCall*> launches;
  for (const auto& c : t.api_calls)
    if (c.name == "cudaLaunchKernel") launches.push_back(&c);
  ASSERT_EQ(launches.size(), 100u);
  for (const auto* r : launch_ranges) {
    const auto inside = std::count_if(launches.begin(), launches.end(), [&](const auto* c) {
      return c->thread == r->thread && c->start_ns >= r->start_ns && c->end_ns <= r->end_ns;
    });
    EXPECT_EQ(inside, 1) << "range " << r->start_ns << ".." << r->end_ns;
    EXPECT_GE(r->start_ns, outer[0]->start_ns);
    EXPECT_LE(r->end_ns, outer[0]->end_ns);
  }
  // The outer range ends after the synchronize: every kernel ran inside it.
  for (const auto& k : t.kernels) {
    EXPECT_GE(k.start_ns, outer[0]->start_ns);
    EXPECT_LE(k.end_ns, outer[0]->end_ns);
  }
  const json& w = d.report["summary"]["window"];
  EXPECT_EQ(w["capture_range"].get<std::string>(), "healthy:kernels") << d.report["summary"].dump(1);
  EXPECT_EQ(w["occurrences"].get<int>(), 1);
  EXPECT_NEAR(w["length_ms"].get<double>(), (outer[0]->end_ns - outer[0]->start_ns) / 1e6, 1e-3);
  EXPECT_EQ(d.report["summary"]["kernels"], 100);
  // NVTX through CUPTI slows each launch's host side (89.7 % busy measured on the H200).
  EXPECT_GT(d.report["summary"]["gpu_busy_percent"].get<double>(), 80.0);
  // The download is queued after the range: analysed out, kept in trace.json.
  EXPECT_LE(d.report["summary"]["memcpys"].get<int>(), 1);
  EXPECT_EQ(t.memcpys.size(), 2u);
}

// gpulab train's "gpulab:train:timed" covers what its img/s figure covers, and leaves out start-up.
TEST(DiagnoseNvtx, TrainTimedRangeIsTheImagesPerSecondClock) {
  GPULAB_REQUIRE_GPU();
  const fs::path result = fs::temp_directory_path() / ("gpulab_nvtx_train_" + std::to_string(getpid()) + ".json");
  // Under racecheck a step at width 64 takes more than a minute (the training tests, session 44),
  // and 15 of them were cut at 300 s (session 48): 4 steps at width 16 there, the same kernels.
  const int steps = under_racecheck() ? 4 : 15;
  const Diagnosis d = diagnose("nvtx_train",
                               kGpulab + " train --synthetic --depth 18 --classes 10 --image-size 64 --batch 32" +
                                   (under_racecheck() ? " --width 16" : "") + " --steps " + std::to_string(steps) +
                                   " --json " + result.string(),
                               "--capture-range gpulab:train:timed");
  if (untraced_under_sanitizer(d)) {
    fs::remove(result);
    return;
  }
  ASSERT_EQ(d.exit_code, 0) << d.out;
  std::ifstream in(result);
  const json train = json::parse(in);
  fs::remove(result);
  const double timed_ms = train[0]["params"]["timed_seconds"].get<double>() * 1000;
  int timed = 0, step_ranges = 0;
  for (const auto& r : d.trace.ranges) {
    timed += r.name == "gpulab:train:timed";
    step_ranges += r.name == "step";
  }
  EXPECT_EQ(timed, 1) << d.out;
  EXPECT_EQ(step_ranges, steps);
  const json& w = d.report["summary"]["window"];
  ASSERT_TRUE(w.is_object()) << d.out;
  EXPECT_EQ(w["occurrences"].get<int>(), 1);
  // Two clocks (steady_clock and CUPTI's) over the same interval: within 2 % or 2 ms.
  EXPECT_NEAR(w["length_ms"].get<double>(), timed_ms, std::max(2.0, 0.02 * timed_ms)) << d.report["summary"].dump(1);
  EXPECT_GT(w["start_ms"].get<double>(), 0);  // start-up (cuDNN's algorithm search) is left out
  EXPECT_LT(d.report["summary"]["kernels"].get<size_t>(), d.trace.kernels.size());
}
