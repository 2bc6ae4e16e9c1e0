// Regression tests for traces the fuzzer (tests/fuzz/fuzz_chrome_trace) found: numbers that do
// not fit the fields they fill were cast (undefined behaviour) or escaped as the wrong exception.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "trace/chrome_trace.h"
#include "trace/report.h"
#include "trace/rules.h"

using namespace gpulab::trace;
namespace fs = std::filesystem;

namespace {

// The reader's notes for `text` (it tolerates malformed fields: noted, skipped or defaulted).
std::string notes_of(const std::string& text) {
  const Trace t = parse_chrome_trace(nlohmann::json::parse(text), "t.json");
  std::string all;
  for (const auto& n : t.notes) all += n + "\n";
  return all;
}

std::string kernel(const std::string& extra_args, const std::string& ts = "1") {
  return R"({"ph": "X", "cat": "kernel", "name": "k", "ts": )" + ts + R"(, "dur": 1, "args": {"device": 0)" + extra_args + "}}";
}

}  // namespace

// Numbers the fuzzer (tests/fuzz/fuzz_chrome_trace) found that do not fit their fields: they
// were cast (undefined behaviour, caught under UBSan); now each is noted and left out.
TEST(TraceRobustness, NumbersBeyondTheirFieldsAreNotedNotCast) {
  EXPECT_NE(notes_of(R"({"traceEvents": [)" + kernel(R"(, "stream": 7.3e59)") + "]}").find("stream"), std::string::npos);
  EXPECT_NE(notes_of(R"({"traceEvents": [)" + kernel(R"(, "grid": [1e300, 1, 1])") + "]}").find("grid"), std::string::npos);
  EXPECT_NE(notes_of(R"({"traceEvents": [)" + kernel(R"(, "block": [4294967296, 1, 1])") + "]}").find("block"),
            std::string::npos);
  // Times whose sum with the base overflows int64_t: the event is skipped.
  for (const char* base : {"9200000000000000000", "-9200000000000000000"}) {
    const std::string doc = std::string(R"({"baseTimeNanoseconds": )") + base + R"(, "traceEvents": [)" +
                            kernel("", base[0] == '-' ? "-3.9e15" : "3.9e15") + "]}";
    EXPECT_NE(notes_of(doc).find("out of range"), std::string::npos) << doc;
    EXPECT_TRUE(parse_chrome_trace(nlohmann::json::parse(doc), "t.json").kernels.empty());
  }
}

TEST(TraceRobustness, DevicePropertiesBeyondTheirFieldsAreNotedNotCast) {
  for (const char* doc : {R"({"deviceProperties": [{"id": 1e300}], "traceEvents": []})",
                          R"({"deviceProperties": [{"id": 0, "numSms": 1e300}], "traceEvents": []})",
                          R"({"gpulab": {"dropped_records": 1e300}, "traceEvents": []})"})
    EXPECT_NE(notes_of(doc).find("not an integer in range"), std::string::npos) << doc << ": " << notes_of(doc);
  const Trace t = parse_chrome_trace(
      nlohmann::json::parse(R"({"deviceProperties": [{"id": 2, "numSms": 132}], "gpulab": {"dropped_records": 3},
                               "traceEvents": [)" + kernel("") + "]}"),
      "t.json");
  EXPECT_EQ(t.devices.at(2).sm_count, 132);
  EXPECT_EQ(t.dropped_records, 3);
  // A trace read back from its own writer is unchanged by the checks.
  const Trace again = parse_chrome_trace(nlohmann::json::parse(chrome_trace_json(t)), "again");
  ASSERT_EQ(again.kernels.size(), 1u);
  EXPECT_EQ(again.kernels[0].end_ns - again.kernels[0].start_ns, 1000);
  EXPECT_EQ(again.devices.at(2).sm_count, 132);
}

TEST(TraceRobustness, NumberBeyondDoubleInAFileIsInvalidJson) {
  const fs::path path = fs::temp_directory_path() / ("gpulab_trace_big_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << R"({"traceEvents": [], "x": 1e99999})";
  try {
    read_chrome_trace(path);
    ADD_FAILURE() << "1e99999 must be refused";
  } catch (const gpulab::core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

// A name cut short for a note or a table ends on a character boundary. The note quoting an odd
// memcpy's name cut a two-byte character in half, and the JSON report then threw
// (fuzz_chrome_trace: crash_name_cut_mid_character; `gpulab diagnose --json` ended with an
// internal error). The text report's kernel table cut names the same way.
TEST(TraceRobustness, NamesCutShortStayValidUtf8) {
  const std::string name = std::string(79, 'x') + "\u0479 tail";  // a two-byte character at bytes 79 and 80
  const std::string text = R"([{"ph": "X", "cat": "gpu_memcpy", "name": ")" + name +
                           R"(", "ts": 0, "dur": 2, "args": {"bytes": 64, "device": 0}},
      {"ph": "X", "cat": "kernel", "name": "y)" + name + "y" + name +
                           R"(", "ts": 3, "dur": 2, "args": {"device": 0}}])";
  const Trace t = parse_chrome_trace(nlohmann::json::parse(text), "t.json");
  const Report report = analyze(t);
  ASSERT_FALSE(report.summary["notes"].empty());
  EXPECT_NO_THROW((void)report_json(report).dump());  // throws on a string that is not UTF-8
  std::ostringstream out;
  print_report(out, report);
  EXPECT_NO_THROW((void)nlohmann::json(out.str()).dump()) << out.str();
  EXPECT_EQ(utf8_prefix("ab\u0479", 3), "ab");
  EXPECT_EQ(utf8_prefix("ab\u0479", 4), "ab\u0479");
  EXPECT_EQ(utf8_prefix("\U0001F600", 3), "");
}
