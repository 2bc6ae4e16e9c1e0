// Chrome-trace reading (PyTorch-profiler layout and ours), writing, and malformed input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/input_error.h"
#include "core/error.h"
#include "trace/chrome_trace.h"
#include "trace/collect.h"
#include "trace/report.h"
#include "trace/rules.h"
#include "trace/synthetic.h"

using namespace gpulab::trace;
using namespace gpulab::trace::testing;
using gpulab::testing::input_error;
namespace fs = std::filesystem;

namespace {

const fs::path kKineto = fs::path(GPULAB_TEST_DATA) / "traces" / "kineto_small.json";

fs::path temp_file(const std::string& name, const std::string& contents) {
  const fs::path p = fs::temp_directory_path() / ("gpulab_trace_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << contents;
  return p;
}

}  // namespace

TEST(ChromeTrace, ReadsKinetoLayout) {
  const Trace t = read_chrome_trace(kKineto);
  EXPECT_TRUE(t.notes.empty()) << t.notes.front();
  ASSERT_EQ(t.kernels.size(), 3u);
  ASSERT_EQ(t.memcpys.size(), 1u);
  ASSERT_EQ(t.memsets.size(), 1u);
  EXPECT_EQ(t.api_calls.size(), 7u);
  EXPECT_EQ(std::count_if(t.api_calls.begin(), t.api_calls.end(), [](auto& c) { return c.driver; }), 1);
  ASSERT_EQ(t.devices.count(0), 1u);
  EXPECT_EQ(t.devices.at(0).sm_count, 132);
  EXPECT_EQ(t.devices.at(0).name, "NVIDIA H100 80GB HBM3");

  const Kernel& k = t.kernels[0];
  EXPECT_EQ(k.name, "void gemm_kernel<float>(float const*, float*, int)");
  EXPECT_EQ(k.grid, (std::array<int, 3>{8, 1, 1}));
  EXPECT_EQ(k.block, (std::array<int, 3>{256, 1, 1}));
  EXPECT_EQ(k.registers, 96);
  EXPECT_EQ(k.shared_memory, 16384);
  EXPECT_EQ(k.stream, 7);
  EXPECT_EQ(k.correlation, 11);
  EXPECT_EQ(k.duration_ns(), 1000000);

  const Memcpy& m = t.memcpys[0];
  EXPECT_EQ(m.kind, CopyKind::htod);
  EXPECT_EQ(m.src, MemoryKind::pageable);
  EXPECT_EQ(m.dst, MemoryKind::device);
  EXPECT_EQ(m.bytes, 33554432);
  EXPECT_EQ(k.start_ns - m.start_ns, 5018000);  // microsecond timestamps near 1e9 keep ns precision
  EXPECT_EQ(t.memsets[0].dst, MemoryKind::device);
  EXPECT_EQ(t.memsets[0].bytes, 1024);
  // "tid" written as a string is the same thread as the numeric one.
  for (const auto& c : t.api_calls) EXPECT_EQ(c.thread, 4242);
}

TEST(ChromeTrace, KinetoTraceGivesExpectedFindings) {
  const Report r = analyze(read_chrome_trace(kKineto));
  ASSERT_EQ(r.findings.size(), 3u) << rules_text(r);
  EXPECT_EQ(r.findings[0].rule, "host_starved");
  EXPECT_EQ(r.findings[0].severity, Severity::high);
  EXPECT_NEAR(r.findings[0].time_lost_ms, 8.98, 1e-6);
  EXPECT_EQ(r.findings[1].rule, "pageable_memcpy");
  EXPECT_EQ(r.findings[1].severity, Severity::high);
  // No link in the trace: PCIe gen 5 x16 assumed from compute capability 9.0, 0.7 x 63 GB/s expected.
  EXPECT_NEAR(r.findings[1].time_lost_ms, 4.990 - 33554432 / (0.7 * 16 * 3.938e9) * 1e3, 2e-3);
  EXPECT_EQ(r.findings[1].evidence["link"].get<std::string>(), "PCIe gen 5 x16 assumed from compute capability 9.0");
  EXPECT_EQ(r.findings[2].rule, "low_occupancy");
  EXPECT_NEAR(r.findings[2].time_lost_ms, 1.0 * (1 - 8.0 / 132), 1e-3);
  EXPECT_EQ(r.findings[2].evidence["top_offenders"][0]["name"], "void gemm_kernel<float>(float const*, float*, int)");
  EXPECT_NEAR(r.summary["span_ms"].get<double>(), 17.025, 1e-9);

  std::ostringstream text;
  print_report(text, r);
  EXPECT_NE(text.str().find("1. [high] host_starved"), std::string::npos) << text.str();
  const std::string html = report_html(read_chrome_trace(kKineto), r);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("pageable_memcpy"), std::string::npos);
}

// A trace with every record kind, at realistic absolute CUPTI timestamps.
Trace every_kind(std::mt19937_64& rng) {
  Synthetic s;
  s.t.devices[1] = DeviceInfo{"other", 16, 4, 8, 8, 6};
  std::uniform_int_distribution<int64_t> jitter(0, 999);
  const double base_us = 1.7e12;  // ~2023 in ns since the epoch, as CUPTI gives
  double t = base_us;
  for (int i = 0; i < 40; ++i) {
    t += 10 + jitter(rng) / 100.0;
    Kernel& k = s.kernel(t, t + 5 + jitter(rng) / 1000.0, 1 + jitter(rng), 1 + int(jitter(rng)), "k" + std::to_string(i % 3));
    k.block = {int(32 + jitter(rng) % 100), 2, 1};
    k.registers = int(jitter(rng) % 255);
    k.shared_memory = jitter(rng) * 64;
    k.device = int(i % 2);
    s.copy(i % 2 ? "cudaMemcpyAsync" : "cudaMemcpy", t + 1, t + 2, t + 3, 7.5, CopyKind(1 + i % 10),
           MemoryKind(i % 8), MemoryKind((i + 3) % 8), jitter(rng) * 4096);
  }
  s.api("cuCtxSynchronize", t + 100, t + 200);
  s.t.api_calls.back().driver = true;
  s.t.api_calls.back().thread = 99;
  Memset m;
  m.correlation = s.api("cudaMemsetAsync", t + 300, t + 301);
  m.start_ns = us(t + 305);
  m.end_ns = us(t + 306.5);
  m.dst = MemoryKind::managed;
  m.bytes = 12345;
  m.stream = 3;
  s.t.memsets.push_back(m);
  for (int i = 0; i < 6; ++i) s.um(UmKind(i), t + 400 + i, i, 0x7f0000000000ull + i * 4096, 65536 * i);
  for (int i = 0; i < 5; ++i) {
    NvmlSample x;
    x.time_ns = us(t + 50 * i);
    x.device = i % 2;
    x.sm_util_percent = 10.0 * i;
    x.mem_util_percent = 3;
    x.pcie_rx_mbps = 1234.5;
    x.pcie_tx_mbps = i == 2 ? -1 : 99;  // unknown stays unknown
    x.power_w = 512.25;
    x.sm_clock_mhz = 1980;
    x.mem_clock_mhz = 2619;
    s.t.samples.push_back(x);
  }
  s.t.dropped_records = 17;
  s.t.um_counters_enabled = true;
  s.t.source = "synthetic";
  return s.t;
}

TEST(ChromeTrace, WriterOutputReadsBackEqual) {
  std::mt19937_64 rng(std::random_device{}());
  const Trace a = every_kind(rng);
  const Trace b = parse_chrome_trace(nlohmann::json::parse(chrome_trace_json(a)), "round trip");
  ASSERT_EQ(b.kernels.size(), a.kernels.size());
  for (size_t i = 0; i < a.kernels.size(); ++i) {
    const Kernel &x = a.kernels[i], &y = b.kernels[i];
    EXPECT_EQ(y.name, x.name);
    EXPECT_EQ(y.start_ns, x.start_ns);
    EXPECT_EQ(y.end_ns, x.end_ns);
    EXPECT_EQ(y.device, x.device);
    EXPECT_EQ(y.stream, x.stream);
    EXPECT_EQ(y.correlation, x.correlation);
    EXPECT_EQ(y.grid, x.grid);
    EXPECT_EQ(y.block, x.block);
    EXPECT_EQ(y.registers, x.registers);
    EXPECT_EQ(y.shared_memory, x.shared_memory);
  }
  ASSERT_EQ(b.memcpys.size(), a.memcpys.size());
  for (size_t i = 0; i < a.memcpys.size(); ++i) {
    const Memcpy &x = a.memcpys[i], &y = b.memcpys[i];
    EXPECT_EQ(y.kind, x.kind) << i;
    EXPECT_EQ(y.src, x.src) << i;
    EXPECT_EQ(y.dst, x.dst) << i;
    EXPECT_EQ(y.bytes, x.bytes);
    EXPECT_EQ(y.start_ns, x.start_ns);
    EXPECT_EQ(y.end_ns, x.end_ns);
    EXPECT_EQ(y.correlation, x.correlation);
  }
  ASSERT_EQ(b.memsets.size(), 1u);
  EXPECT_EQ(b.memsets[0].dst, MemoryKind::managed);
  EXPECT_EQ(b.memsets[0].bytes, 12345);
  EXPECT_EQ(b.memsets[0].end_ns, a.memsets[0].end_ns);
  ASSERT_EQ(b.api_calls.size(), a.api_calls.size());
  for (size_t i = 0; i < a.api_calls.size(); ++i) {
    EXPECT_EQ(b.api_calls[i].name, a.api_calls[i].name);
    EXPECT_EQ(b.api_calls[i].start_ns, a.api_calls[i].start_ns);
    EXPECT_EQ(b.api_calls[i].end_ns, a.api_calls[i].end_ns);
    EXPECT_EQ(b.api_calls[i].thread, a.api_calls[i].thread);
    EXPECT_EQ(b.api_calls[i].correlation, a.api_calls[i].correlation);
    EXPECT_EQ(b.api_calls[i].driver, a.api_calls[i].driver);
  }
  ASSERT_EQ(b.um_events.size(), a.um_events.size());
  for (size_t i = 0; i < a.um_events.size(); ++i) {
    EXPECT_EQ(b.um_events[i].kind, a.um_events[i].kind);
    EXPECT_EQ(b.um_events[i].start_ns, a.um_events[i].start_ns);
    EXPECT_EQ(b.um_events[i].end_ns, a.um_events[i].end_ns);
    EXPECT_EQ(b.um_events[i].address, a.um_events[i].address);
    EXPECT_EQ(b.um_events[i].value, a.um_events[i].value);
  }
  ASSERT_EQ(b.samples.size(), a.samples.size());
  for (size_t i = 0; i < a.samples.size(); ++i) {
    EXPECT_EQ(b.samples[i].time_ns, a.samples[i].time_ns);
    EXPECT_EQ(b.samples[i].device, a.samples[i].device);
    EXPECT_EQ(b.samples[i].sm_util_percent, a.samples[i].sm_util_percent);
    EXPECT_EQ(b.samples[i].pcie_tx_mbps, a.samples[i].pcie_tx_mbps);
    EXPECT_EQ(b.samples[i].power_w, a.samples[i].power_w);
    EXPECT_EQ(b.samples[i].mem_clock_mhz, a.samples[i].mem_clock_mhz);
  }
  ASSERT_EQ(b.devices.size(), 2u);
  EXPECT_EQ(b.devices.at(0).sm_count, 132);
  EXPECT_EQ(b.devices.at(0).pcie_generation, 5);
  EXPECT_EQ(b.devices.at(1).pcie_width, 8);
  EXPECT_EQ(b.devices.at(1).compute_major, 8);
  EXPECT_EQ(b.devices.at(1).compute_minor, 6);
  EXPECT_EQ(b.dropped_records, 17);
  EXPECT_TRUE(b.um_counters_enabled);

  // Same findings either way.
  auto ra = report_json(analyze(a)), rb = report_json(analyze(b));
  ra["summary"].erase("source");
  rb["summary"].erase("source");
  EXPECT_EQ(ra, rb);
}

TEST(ChromeTrace, UnreadableInputIsAClearInputError) {
  EXPECT_NE(input_error([] { read_chrome_trace("/nonexistent/trace.json"); }).find("/nonexistent/trace.json"),
            std::string::npos);
  const fs::path truncated = temp_file("truncated.json", R"({"traceEvents": [{"ph": "X", "cat": "kernel")");
  const std::string e1 = input_error([&] { read_chrome_trace(truncated); });
  EXPECT_NE(e1.find(truncated.string()), std::string::npos) << e1;
  EXPECT_NE(e1.find("not valid JSON"), std::string::npos) << e1;
  fs::remove(truncated);
  const fs::path gz = temp_file("trace.json.gz", std::string("\x1f\x8b\x08\x00", 4));
  EXPECT_NE(input_error([&] { read_chrome_trace(gz); }).find("gzip-compressed; decompress it first"), std::string::npos);
  fs::remove(gz);
  const fs::path no_events = temp_file("no_events.json", R"({"events": []})");
  EXPECT_NE(input_error([&] { read_chrome_trace(no_events); }).find("traceEvents"), std::string::npos);
  fs::remove(no_events);
  EXPECT_NE(input_error([] { parse_chrome_trace(nlohmann::json::parse(R"({"traceEvents": 3})"), "t.json"); })
                .find("t.json: not a Chrome trace"),
            std::string::npos);
}

namespace {

// The notes of a trace holding `events` (JSON text); the trace itself goes to `out`.
std::vector<std::string> notes_of(const std::string& events, Trace* out = nullptr) {
  Trace t = parse_chrome_trace(nlohmann::json::parse(R"({"traceEvents": [)" + events + "]}"), "t.json");
  std::vector<std::string> notes = t.notes;
  if (out) *out = std::move(t);
  return notes;
}

bool has_note(const std::vector<std::string>& notes, const std::string& part) {
  return std::any_of(notes.begin(), notes.end(), [&](const std::string& n) { return n.find(part) != std::string::npos; });
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

}  // namespace

TEST(ChromeTrace, MalformedEventsAreSkippedWithANote) {
  Trace t;
  // Missing or non-numeric times: the event is skipped, the note counts them and names the first.
  auto n = notes_of(R"({"ph": "X", "cat": "kernel", "name": "k", "dur": 1},
                      {"ph": "X", "cat": "kernel", "name": "k2", "ts": 5},
                      {"ph": "X", "cat": "kernel", "name": "k3", "ts": 1, "dur": 2},
                      {"ph": "X", "cat": "kernel", "name": "k4", "dur": 1})", &t);
  EXPECT_EQ(t.kernels.size(), 1u);
  EXPECT_EQ(t.kernels[0].name, "k3");
  EXPECT_TRUE(has_note(n, "2 x kernel event without a numeric \"ts\", skipped (first: event 0 \"k\")")) << joined(n);
  EXPECT_TRUE(has_note(n, "1 x kernel event without a numeric \"dur\", skipped (first: event 1 \"k2\")")) << joined(n);
  n = notes_of(R"({"ph": "X", "cat": "gpu_memcpy", "name": "m", "ts": 1, "dur": "x"},
                 {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": -3},
                 {"ph": "X", "cat": "gpu_memset", "name": "s", "ts": 1e300, "dur": 1})", &t);
  EXPECT_TRUE(t.memcpys.empty() && t.api_calls.empty() && t.memsets.empty());
  EXPECT_TRUE(has_note(n, "gpu_memcpy event without a numeric \"dur\"")) << joined(n);
  EXPECT_TRUE(has_note(n, "cuda_runtime event with a negative \"dur\"")) << joined(n);
  EXPECT_TRUE(has_note(n, "gpu_memset event with \"ts\" out of range")) << joined(n);
  // Malformed arguments fall back to their defaults; the event is kept.
  n = notes_of(R"({"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": 2, "tid": 9,
                   "args": {"grid": 5, "block": [32, "x"], "stream": [1], "registers per thread": "many",
                            "shared memory": 1e300}})", &t);
  ASSERT_EQ(t.kernels.size(), 1u);
  EXPECT_EQ(t.kernels[0].grid, (std::array<int, 3>{1, 1, 1}));
  EXPECT_EQ(t.kernels[0].block, (std::array<int, 3>{1, 1, 1}));
  EXPECT_EQ(t.kernels[0].stream, 9);  // from "tid"
  EXPECT_EQ(t.kernels[0].device, 2);  // from "pid"
  EXPECT_EQ(t.kernels[0].registers, 0);
  EXPECT_TRUE(has_note(n, "kernel event with argument \"grid\" not [x, y, z], ignored")) << joined(n);
  EXPECT_TRUE(has_note(n, "kernel event with argument \"block\" not [x, y, z]")) << joined(n);
  EXPECT_TRUE(has_note(n, "non-numeric argument \"stream\"")) << joined(n);
  EXPECT_TRUE(has_note(n, "non-numeric argument \"registers per thread\"")) << joined(n);
  EXPECT_TRUE(has_note(n, "non-numeric argument \"shared memory\"")) << joined(n);  // out of int64 range
  EXPECT_EQ(t.kernels[0].shared_memory, 0);
  // Other problems, each noted.
  n = notes_of(R"json(3, {"ph": "X", "cat": "gpulab_um", "name": "teleport", "ts": 1, "dur": 1},
                 {"ph": "C", "cat": "gpulab_nvml", "name": "power (W)", "ts": 1, "args": {"value": "hot"}},
                 {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 1, "dur": 2})json", &t);
  EXPECT_TRUE(has_note(n, "trace event that is not an object")) << joined(n);
  EXPECT_TRUE(has_note(n, "unknown unified-memory kind")) << joined(n);
  EXPECT_TRUE(has_note(n, "gpulab_nvml event without a numeric \"value\"")) << joined(n);
  EXPECT_TRUE(has_note(n, "direction or memory kinds unknown")) << joined(n);
  ASSERT_EQ(t.memcpys.size(), 1u);
  EXPECT_EQ(t.memcpys[0].kind, CopyKind::htod);
  EXPECT_EQ(t.memcpys[0].src, MemoryKind::unknown);
  // GPU work without its host side: said once, since no cause can be found.
  EXPECT_TRUE(has_note(n, "no CUDA runtime or driver API events")) << joined(n);
  n = notes_of(R"({"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"correlation": 4}},
                 {"ph": "X", "cat": "kernel", "name": "k", "ts": 3, "dur": 1},
                 {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 1, "args": {"correlation": 5}})");
  EXPECT_TRUE(has_note(n, "1 of 2 GPU events carry no correlation id")) << joined(n);
  EXPECT_TRUE(has_note(n, "1 of 2 GPU events have no API call with their correlation id")) << joined(n);

  // Fields of the wrong JSON type at the top level are noted and ignored too.
  t = parse_chrome_trace(nlohmann::json::parse(R"({"gpulab": {"dropped_records": "none"},
      "deviceProperties": [{"id": 0, "numSms": "many", "name": "G"}, {"name": "no id"}], "traceEvents": []})"),
                         "t.json");
  EXPECT_TRUE(has_note(t.notes, "gpulab \"dropped_records\" has an unexpected type")) << joined(t.notes);
  EXPECT_TRUE(has_note(t.notes, "deviceProperties 0 \"numSms\" has an unexpected type")) << joined(t.notes);
  EXPECT_TRUE(has_note(t.notes, "deviceProperties entry without a numeric \"id\"")) << joined(t.notes);
  ASSERT_EQ(t.devices.count(0), 1u);
  EXPECT_EQ(t.devices.at(0).name, "G");
  EXPECT_EQ(t.devices.at(0).sm_count, 0);

  // Notes reach the report: JSON summary and terminal text.
  n = notes_of(R"({"ph": "X", "cat": "kernel", "name": "k", "dur": 1})", &t);
  const Report r = analyze(t);
  ASSERT_TRUE(r.summary.contains("notes"));
  EXPECT_NE(r.summary["notes"][0].get<std::string>().find("without a numeric \"ts\""), std::string::npos);
  std::ostringstream text;
  print_report(text, r);
  EXPECT_NE(text.str().find("note: 1 x kernel event without"), std::string::npos) << text.str();
}

TEST(ChromeTrace, ToleratesOtherWritersAndOlderProfilers) {
  const auto parse = [](const char* text) { return parse_chrome_trace(nlohmann::json::parse(text), "t.json"); };
  // Unknown categories and phases are skipped silently.
  EXPECT_TRUE(parse(R"({"traceEvents": [{"ph": "X", "cat": "python_function", "name": "f"}, {"ph": "B"}]})").notes.empty());
  // Older profilers' capitalised categories, and the old "Pagable" spelling.
  const Trace legacy = parse(R"json({"traceEvents": [
      {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 1, "args": {"correlation": 4}},
      {"ph": "X", "cat": "Kernel", "name": "k", "ts": 3, "dur": 2, "args": {"correlation": 4}},
      {"ph": "X", "cat": "Memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 6, "dur": 2},
      {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pagable -> Device)", "ts": 9, "dur": 2}]})json");
  EXPECT_EQ(legacy.api_calls.size(), 1u);
  EXPECT_EQ(legacy.kernels.size(), 1u);
  ASSERT_EQ(legacy.memcpys.size(), 2u);
  EXPECT_EQ(legacy.memcpys[0].dst, MemoryKind::pinned);
  EXPECT_EQ(legacy.memcpys[1].src, MemoryKind::pageable);
  // Numbers written as strings, as some converters do; integers beyond 2^53 stay exact.
  const Trace quoted = parse(R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "1.5", "dur": "2",
      "tid": "7", "args": {"correlation": "12", "grid": ["4", 2, 1]}},
      {"ph": "X", "cat": "gpulab_um", "name": "cpu_fault", "ts": 1, "dur": 0, "args": {"address": 9007199254740993}}]})");
  ASSERT_EQ(quoted.kernels.size(), 1u);
  EXPECT_EQ(quoted.kernels[0].start_ns, 1500);
  EXPECT_EQ(quoted.kernels[0].end_ns, 3500);
  EXPECT_EQ(quoted.kernels[0].stream, 7);
  EXPECT_EQ(quoted.kernels[0].correlation, 12);
  EXPECT_EQ(quoted.kernels[0].grid, (std::array<int, 3>{4, 2, 1}));
  ASSERT_EQ(quoted.um_events.size(), 1u);
  EXPECT_EQ(quoted.um_events[0].address, 9007199254740993ull);
  // A bare array is a valid Chrome trace too.
  EXPECT_EQ(parse(R"([{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}])").kernels.size(), 1u);
}

// A trace in the layout torch 2.x's profiler writes (times relative to "baseTimeNanoseconds",
// three decimals; python_function, cpu_op, user annotations, flows, cuda_sync, overhead, "Spans"
// rows, metadata): .item() after each 60 us kernel, i.e. a blocking device-to-pageable copy.
TEST(ChromeTrace, ReadsTorchProfilerLayout) {
  const Trace t = read_chrome_trace(fs::path(GPULAB_TEST_DATA) / "traces" / "kineto_torch_layout.json");
  EXPECT_TRUE(t.notes.empty()) << joined(t.notes);
  ASSERT_EQ(t.kernels.size(), 8u);
  ASSERT_EQ(t.memcpys.size(), 8u);
  ASSERT_EQ(t.memsets.size(), 1u);
  EXPECT_EQ(t.api_calls.size(), 25u);
  EXPECT_TRUE(t.um_events.empty());
  constexpr int64_t kBase = 1764441600123456789;
  EXPECT_EQ(t.kernels[0].start_ns, kBase + 1006000);  // exact: base beyond 2^53, ts relative
  EXPECT_EQ(t.kernels[7].end_ns, kBase + 1626000);
  EXPECT_EQ(t.kernels[0].grid, (std::array<int, 3>{65536, 1, 1}));
  EXPECT_EQ(t.kernels[0].registers, 26);
  EXPECT_EQ(t.kernels[0].correlation, 10);
  EXPECT_EQ(t.memcpys[3].kind, CopyKind::dtoh);
  EXPECT_EQ(t.memcpys[3].src, MemoryKind::device);
  EXPECT_EQ(t.memcpys[3].dst, MemoryKind::pageable);
  EXPECT_EQ(t.memcpys[3].bytes, 4);
  EXPECT_EQ(t.memcpys[3].start_ns - t.kernels[3].end_ns, 0);
  EXPECT_EQ(t.memsets[0].bytes, 512);  // "memory bandwidth (GB/s)": "N/A" is not read
  for (const auto& c : t.api_calls) EXPECT_EQ(c.thread, 51234);
  ASSERT_EQ(t.devices.count(0), 1u);
  EXPECT_EQ(t.devices.at(0).name, "NVIDIA H200");
  EXPECT_EQ(t.devices.at(0).sm_count, 132);

  // The GPU annotation and cuda_sync rows are not GPU work: 7 idle gaps of 18 us remain, each
  // after a cudaMemcpyAsync into pageable memory that blocked until the kernel before it ended.
  const Report r = analyze(t);
  EXPECT_NEAR(r.summary["span_ms"].get<double>(), 0.622, 1e-9);
  EXPECT_NEAR(r.summary["gpu_busy_ms"].get<double>(), 0.496, 1e-9);
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].rule, "sync_memcpy") << rules_text(r);
  EXPECT_EQ(r.findings[0].severity, Severity::high);
  EXPECT_NEAR(r.findings[0].time_lost_ms, 7 * 0.018, 1e-9);
  EXPECT_EQ(r.findings[0].evidence["gaps_after_blocking_call"], 7);
  EXPECT_EQ(r.findings[0].evidence["top_calls"][0]["name"].get<std::string>(), "cudaMemcpyAsync");
  EXPECT_EQ(r.findings[0].evidence["top_calls"][0]["count"], 8);
  EXPECT_EQ(find_rule(r, "sync_api"), nullptr) << rules_text(r);  // the synchronize ran on an idle GPU
  EXPECT_EQ(find_rule(r, "low_gpu_utilization"), nullptr) << rules_text(r);
  EXPECT_EQ(find_rule(r, "launch_bound"), nullptr) << rules_text(r);
}

// Per-process traces merged into one: correlation ids kept apart, counts summed, notes kept with
// the file they came from.
TEST(ChromeTrace, MergeKeepsProcessesApart) {
  Synthetic a, b;
  a.kernel(0, 5, 10);
  b.kernel(0, 7, 10);  // the same correlation id (1) in another process
  a.t.dropped_records = 2;
  b.t.dropped_records = 3;
  const fs::path fa = temp_file("process-1.json", chrome_trace_json(a.t));
  nlohmann::json doc = nlohmann::json::parse(chrome_trace_json(b.t));
  doc["traceEvents"].push_back({{"ph", "X"}, {"cat", "kernel"}, {"name", "broken"}, {"ts", 1}});
  const fs::path fb = temp_file("process-2.json", doc.dump());
  const Trace m = merge_traces({fa, fb});
  fs::remove(fa);
  fs::remove(fb);
  ASSERT_EQ(m.kernels.size(), 2u);
  ASSERT_EQ(m.api_calls.size(), 2u);
  EXPECT_NE(m.kernels[0].correlation, m.kernels[1].correlation);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(m.kernels[i].correlation, m.api_calls[i].correlation);
  EXPECT_EQ(m.dropped_records, 5);
  ASSERT_EQ(m.notes.size(), 1u) << joined(m.notes);
  EXPECT_EQ(m.notes[0].rfind(fb.filename().string() + ": 1 x kernel event without a numeric \"dur\"", 0), 0u) << m.notes[0];
}
