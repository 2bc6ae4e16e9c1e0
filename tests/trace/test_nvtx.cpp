// NVTX ranges: CUPTI marker records to ranges, their Chrome-trace form (ours and Kineto's), and
// --capture-range, the analysis window they define.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/run_command.h"
#include "common/input_error.h"
#include "core/error.h"
#include "trace/chrome_trace.h"
#include "trace/nvtx.h"
#include "trace/rules.h"
#include "trace/synthetic.h"
#include "trace/window.h"

using namespace gpulab::trace;
using namespace gpulab::trace::testing;
using gpulab::testing::input_error;
using gpulab::testing::run_command;
namespace fs = std::filesystem;

namespace {

using Kind = MarkerRecord::Kind;

MarkerRecord marker(Kind kind, uint32_t id, int64_t time_ns, std::string_view name = "", int64_t thread = 0,
                    std::string_view domain = "") {
  MarkerRecord m;
  m.kind = kind;
  m.id = id;
  m.time_ns = time_ns;
  m.name = name;
  m.thread = thread;
  m.domain = domain;
  return m;
}

NvtxRange range(const std::string& name, double start_us, double end_us, int64_t thread = 1) {
  NvtxRange r;
  r.name = name;
  r.start_ns = us(start_us);
  r.end_ns = us(end_us);
  r.thread = thread;
  return r;
}

// 50 kernels of 2 ms, each launched 8 ms after the previous one ended (the host was busy: a
// starved startup), then 200 kernels of 2 ms queued ahead and run back to back inside the range
// "timed", which starts at 420 ms.
Synthetic starved_startup_then_steady() {
  Synthetic s;
  for (int i = 0; i < 50; ++i) {
    const double launch = i * 8003.0 + 8000;
    s.kernel(launch, launch + 10, 2000);
  }
  constexpr double kSteady = 420'000;
  for (int i = 0; i < 200; ++i) s.kernel(kSteady + i * 5.0, kSteady + 10 + i * 2000.0, 2000);
  s.t.ranges.push_back(range("startup", 8000, 410'000));
  s.t.ranges.push_back(range("timed", kSteady, kSteady + 10 + 200 * 2000.0));
  return s;
}

}  // namespace

TEST(MarkerMatcher, StartAndEndRecordsBecomeRanges) {
  MarkerMatcher m;
  std::vector<NvtxRange> out;
  m.add(marker(Kind::start, 1, 100, "outer", 7, "gpulab"), out);
  m.add(marker(Kind::start, 2, 150, "inner", 7), out);
  m.add(marker(Kind::instant, 3, 160, "mark", 7), out);  // nvtxMark: not a range
  EXPECT_TRUE(out.empty());
  m.add(marker(Kind::end, 2, 170, "", 7), out);  // an end carries no name: matched by id
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].name, "inner");
  EXPECT_EQ(out[0].start_ns, 150);
  EXPECT_EQ(out[0].end_ns, 170);
  EXPECT_EQ(out[0].thread, 7);
  EXPECT_TRUE(out[0].domain.empty());
  // The outer range's end comes in a later buffer, recorded on another thread (start/end ranges may).
  std::vector<NvtxRange> later;
  m.add(marker(Kind::end, 9, 180), later);      // never started: ignored
  m.add(marker(Kind::start, 4, 0, "untimed"), later);  // CUPTI had no time for it: ignored
  m.add(marker(Kind::end, 4, 190), later);
  m.add(marker(Kind::end, 1, 200, "", 8), later);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].name, "outer");
  EXPECT_EQ(later[0].domain, "gpulab");
  EXPECT_EQ(later[0].start_ns, 100);
  EXPECT_EQ(later[0].end_ns, 200);
  EXPECT_EQ(later[0].thread, 7);  // the thread that opened it
  EXPECT_FALSE(later[0].gpu);
  // Nothing stays open.
  std::vector<NvtxRange> rest;
  m.close_open(1000, rest);
  EXPECT_TRUE(rest.empty());
}

TEST(MarkerMatcher, RangesOpenAtTheEndCloseThereInStartOrder) {
  MarkerMatcher m;
  std::vector<NvtxRange> out;
  for (uint32_t id = 10; id > 0; --id) m.add(marker(Kind::start, id, 100 * id, "r" + std::to_string(id)), out);
  m.add(marker(Kind::end, 5, 550), out);
  ASSERT_EQ(out.size(), 1u);
  m.close_open(2000, out);
  ASSERT_EQ(out.size(), 10u);
  for (size_t i = 1; i < out.size(); ++i) EXPECT_EQ(out[i].end_ns, 2000);
  for (size_t i = 2; i < out.size(); ++i) EXPECT_LT(out[i - 1].start_ns, out[i].start_ns);
  EXPECT_EQ(out[1].name, "r1");
  EXPECT_EQ(out[9].name, "r10");
  // A start reused after its end opens a new range; an id reused while open restarts it.
  m.add(marker(Kind::start, 5, 3000, "again"), out);
  m.add(marker(Kind::start, 5, 3100, "again2"), out);
  m.add(marker(Kind::end, 5, 3200), out);
  ASSERT_EQ(out.size(), 11u);
  EXPECT_EQ(out[10].name, "again2");
  EXPECT_EQ(out[10].start_ns, 3100);
}

TEST(CaptureWindow, SpansFirstStartToLastEndOfTheName) {
  Trace t;
  t.ranges = {range("step", 100, 200), range("timed", 150, 400), range("step", 300, 350), range("step", 500, 520),
              range("timed", 600, 700)};
  t.samples.push_back(NvmlSample{us(50)});
  const AnalysisWindow w = capture_window(t, "step");
  EXPECT_EQ(w.range, "step");
  EXPECT_EQ(w.start_ns, us(100));
  EXPECT_EQ(w.end_ns, us(520));
  EXPECT_EQ(w.occurrences, 3);
  EXPECT_EQ(w.trace_start_ns, us(50));
  const AnalysisWindow timed = capture_window(t, "timed");
  EXPECT_EQ(timed.start_ns, us(150));
  EXPECT_EQ(timed.end_ns, us(700));
  EXPECT_EQ(timed.occurrences, 2);
}

TEST(CaptureWindow, UnknownNameListsTheRangesThatExist) {
  Trace t;
  t.source = "prog";
  t.ranges = {range("step", 100, 200), range("gpulab:train:timed", 150, 400), range("step", 300, 350)};
  const std::string e = input_error([&] { capture_window(t, "gpulab:train"); });
  EXPECT_NE(e.find("--capture-range gpulab:train: no range of that name in prog"), std::string::npos) << e;
  EXPECT_NE(e.find("its ranges are: step, gpulab:train:timed"), std::string::npos) << e;  // each name once
  EXPECT_EQ(e.find("step, gpulab:train:timed, step"), std::string::npos) << e;
  const std::string none = input_error([] { capture_window(Trace{}, "x"); });
  EXPECT_NE(none.find("has no NVTX or user_annotation ranges"), std::string::npos) << none;
  // Many names: the first 20 and a count.
  for (int i = 0; i < 25; ++i) t.ranges.push_back(range("r" + std::to_string(i), 0, 1));
  const std::string many = input_error([&] { capture_window(t, "nope"); });
  EXPECT_NE(many.find(", r17 and 7 more"), std::string::npos) << many;
}

TEST(CaptureWindow, ClipDropsRecordsOutsideAndCutsThoseAcross) {
  Synthetic s;
  s.kernel(0, 10, 90);                     // [10, 100]: before the window
  s.kernel(100, 150, 100);                 // [150, 250]: cut to [200, 250]
  s.kernel(210, 220, 30);                  // inside
  s.kernel(230, 280, 100);                 // [280, 380]: cut to [280, 300]
  s.kernel(290, 300, 50);                  // starts at the window's end: outside
  s.copy("cudaMemcpyAsync", 240, 245, 260, 80, CopyKind::htod, MemoryKind::pinned, MemoryKind::device, 8000);
  s.um(UmKind::gpu_fault, 200, 0, 0x1000, 3);    // an instant on the edge: kept
  s.um(UmKind::cpu_fault, 300.5, 0, 0x2000, 1);  // after: dropped
  s.um(UmKind::htod_migration, 190, 20, 0x3000, 4096);
  for (double at : {199.0, 200.0, 250.0, 300.0, 301.0}) s.t.samples.push_back(NvmlSample{us(at)});
  s.t.ranges = {range("timed", 200, 300), range("step", 180, 220), range("late", 310, 320)};
  s.t.notes = {"a note"};
  const AnalysisWindow w = capture_window(s.t, "timed");
  const Trace c = clip_to_window(s.t, w);

  ASSERT_EQ(c.kernels.size(), 3u);
  EXPECT_EQ(c.kernels[0].start_ns, us(200));
  EXPECT_EQ(c.kernels[0].end_ns, us(250));
  EXPECT_EQ(c.kernels[0].correlation, s.t.kernels[1].correlation);
  EXPECT_EQ(c.kernels[1].start_ns, us(220));
  EXPECT_EQ(c.kernels[1].end_ns, us(250));
  EXPECT_EQ(c.kernels[2].start_ns, us(280));
  EXPECT_EQ(c.kernels[2].end_ns, us(300));
  ASSERT_EQ(c.memcpys.size(), 1u);  // [260, 340] cut to [260, 300]: half its time, half its bytes
  EXPECT_EQ(c.memcpys[0].end_ns, us(300));
  EXPECT_EQ(c.memcpys[0].bytes, 4000);
  // API calls: the launches at 210, 230, 290 and the copy's at 240 lie inside; the one at 100 does not.
  ASSERT_EQ(c.api_calls.size(), 4u);
  for (const auto& a : c.api_calls) EXPECT_GE(a.start_ns, us(200));
  ASSERT_EQ(c.um_events.size(), 2u);
  EXPECT_EQ(c.um_events[0].kind, UmKind::gpu_fault);
  EXPECT_EQ(c.um_events[0].value, 3);
  EXPECT_EQ(c.um_events[1].start_ns, us(200));  // [190, 210] cut to [200, 210]
  EXPECT_EQ(c.um_events[1].value, 2048);
  ASSERT_EQ(c.samples.size(), 3u);
  EXPECT_EQ(c.samples.front().time_ns, us(200));
  EXPECT_EQ(c.samples.back().time_ns, us(300));
  ASSERT_EQ(c.ranges.size(), 2u);
  EXPECT_EQ(c.ranges[1].name, "step");
  EXPECT_EQ(c.ranges[1].start_ns, us(200));
  EXPECT_EQ(c.devices.at(0).sm_count, 132);
  EXPECT_EQ(c.notes, s.t.notes);
  ASSERT_TRUE(c.window);
  EXPECT_EQ(c.window->range, "timed");
  EXPECT_EQ(c.window->start_ns, us(200));
  EXPECT_EQ(c.window->end_ns, us(300));
}

// The point of --capture-range: a starved startup dominates the whole run's diagnosis, while the
// steady state it measures is healthy.
TEST(CaptureWindow, RulesSeeOnlyTheSteadyState) {
  const Trace full = starved_startup_then_steady().t;
  const Report whole = analyze(full);
  ASSERT_FALSE(whole.findings.empty());
  EXPECT_EQ(whole.findings[0].rule, "host_starved") << rules_text(whole);
  EXPECT_LT(whole.summary["gpu_busy_percent"].get<double>(), 75);
  EXPECT_FALSE(whole.summary.contains("window"));
  EXPECT_EQ(whole.summary["nvtx_ranges"].get<int>(), 2);

  const Report steady = analyze(clip_to_window(full, capture_window(full, "timed")));
  EXPECT_EQ(find_rule(steady, "host_starved"), nullptr) << rules_text(steady);
  for (const auto& f : steady.findings) EXPECT_NE(f.severity, Severity::high) << rules_text(steady);
  EXPECT_GT(steady.summary["gpu_busy_percent"].get<double>(), 99.9);
  EXPECT_EQ(steady.summary["kernels"].get<int>(), 200);
  const auto& w = steady.summary["window"];
  EXPECT_EQ(w["capture_range"].get<std::string>(), "timed");
  EXPECT_EQ(w["occurrences"].get<int>(), 1);
  // Placed from the first record of the whole trace (the first launch, at 8 ms).
  EXPECT_DOUBLE_EQ(w["start_ms"].get<double>(), 412.0);
  EXPECT_DOUBLE_EQ(w["end_ms"].get<double>(), 812.01);
  EXPECT_DOUBLE_EQ(w["length_ms"].get<double>(), 400.01);
  EXPECT_EQ(report_json(steady)["summary"]["window"], w);
}

TEST(NvtxChromeTrace, RangesRoundTrip) {
  Synthetic s;
  s.kernel(0, 10, 100);
  NvtxRange host = range("gpulab:train:timed", 5, 900, 4242);
  host.domain = "gpulab";
  NvtxRange gpu = range("step", 12, 700, 7);
  gpu.gpu = true;
  gpu.device = 1;
  s.t.ranges = {host, gpu, range("step", 6, 8, 4243)};
  const Trace back = parse_chrome_trace(nlohmann::json::parse(chrome_trace_json(s.t)), "ours");
  EXPECT_TRUE(back.notes.empty());
  ASSERT_EQ(back.ranges.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const NvtxRange &a = s.t.ranges[i], &b = back.ranges[i];
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.domain, a.domain);
    EXPECT_EQ(b.start_ns, a.start_ns);
    EXPECT_EQ(b.end_ns, a.end_ns);
    EXPECT_EQ(b.thread, a.thread);
    EXPECT_EQ(b.gpu, a.gpu);
    EXPECT_EQ(b.device, a.device);
  }
  // On the host row, in Kineto's category, beside the thread's CUDA calls.
  const auto doc = nlohmann::json::parse(chrome_trace_json(s.t));
  int annotations = 0;
  for (const auto& e : doc["traceEvents"])
    if (e.value("cat", "") == "user_annotation") {
      ++annotations;
      EXPECT_EQ(e["ph"].get<std::string>(), "X");
      EXPECT_EQ(e["pid"], doc["traceEvents"][0]["pid"]);  // the first event is a CUDA call: the host row
    }
  EXPECT_EQ(annotations, 2);
}

TEST(NvtxChromeTrace, ReadsKinetoUserAnnotations) {
  const Trace t = read_chrome_trace(fs::path(GPULAB_TEST_DATA) / "traces" / "kineto_torch_layout.json");
  constexpr int64_t kBase = 1764441600123456789;
  ASSERT_EQ(t.ranges.size(), 2u);
  const NvtxRange& gpu = t.ranges[0];
  EXPECT_EQ(gpu.name, "step");
  EXPECT_TRUE(gpu.gpu);
  EXPECT_EQ(gpu.device, 0);
  EXPECT_EQ(gpu.thread, 7);
  EXPECT_EQ(gpu.start_ns, kBase + 1005999);
  EXPECT_EQ(gpu.end_ns, kBase + 1005999 + 622003);
  const NvtxRange& host = t.ranges[1];
  EXPECT_EQ(host.name, "step");
  EXPECT_FALSE(host.gpu);
  EXPECT_EQ(host.thread, 51234);
  EXPECT_EQ(host.start_ns, kBase + 999000);
  EXPECT_EQ(host.end_ns, kBase + 1634000);
  // The window runs from the host range's start to the later end of the two.
  const AnalysisWindow w = capture_window(t, "step");
  EXPECT_EQ(w.start_ns, kBase + 999000);
  EXPECT_EQ(w.end_ns, kBase + 1634000);
  EXPECT_EQ(w.occurrences, 2);
  // An instant annotation ("ph": "i") is not a range.
  EXPECT_TRUE(read_chrome_trace(fs::path(GPULAB_TEST_DATA) / "traces" / "kineto_small.json").ranges.empty());
}

TEST(NvtxCli, CaptureRangeRestrictsTheAnalysisAndKeepsTheFullTrace) {
  const fs::path dir = fs::temp_directory_path() / ("gpulab_nvtx_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "in.json") << chrome_trace_json(starved_startup_then_steady().t);
  const std::string base = std::string(GPULAB_EXE) + " diagnose --trace " + (dir / "in.json").string();

  const auto whole = run_command(base + " --json " + (dir / "whole.json").string());
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  EXPECT_NE(whole.out.find("1. [high] host_starved"), std::string::npos) << whole.out;

  const auto r = run_command(base + " --capture-range timed --json " + (dir / "f.json").string() + " --out " +
                             (dir / "out").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("host_starved"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("analysed window (--capture-range timed): 412.000 to 812.010 ms of the trace"),
            std::string::npos)
      << r.out;
  std::ifstream in(dir / "f.json");
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["summary"]["window"]["capture_range"].get<std::string>(), "timed");
  EXPECT_EQ(j["summary"]["kernels"].get<int>(), 200);
  const Trace kept = read_chrome_trace(dir / "out" / "trace.json");
  EXPECT_EQ(kept.kernels.size(), 250u);
  EXPECT_EQ(kept.ranges.size(), 2u);

  const auto bad = run_command(base + " --capture-range gpulab:train:timed");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--capture-range gpulab:train:timed: no range of that name"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("its ranges are: startup, timed"), std::string::npos) << bad.out;
  fs::remove_all(dir);
}
