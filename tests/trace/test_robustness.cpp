// Regression tests for traces the fuzzer (tests/fuzz/fuzz_chrome_trace) found: numbers that do
// not fit the fields they fill were cast (undefined behaviour) or escaped as the wrong exception.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "trace/chrome_trace.h"

using namespace gpulab::trace;
namespace fs = std::filesystem;

namespace {

std::string refusal(const std::string& text) {
  try {
    parse_chrome_trace(nlohmann::json::parse(text), "t.json");
  } catch (const gpulab::core::InputError& e) {
    return e.what();
  }
  return "";
}

std::string kernel(const std::string& extra_args, const std::string& ts = "1") {
  return R"({"ph": "X", "cat": "kernel", "name": "k", "ts": )" + ts + R"(, "dur": 1, "args": {"device": 0)" + extra_args + "}}";
}

}  // namespace

TEST(TraceRobustness, NumbersBeyondTheirFieldsAreRefusedNotCast) {
  // crash_stream_beyond_int64 in the corpus: "stream": 7.3e59 was cast to int64_t.
  EXPECT_NE(refusal(R"({"traceEvents": [)" + kernel(R"(, "stream": 7.3e59)") + "]}").find("\"stream\""), std::string::npos);
  EXPECT_NE(refusal(R"({"traceEvents": [)" + kernel(R"(, "correlation": -1e300)") + "]}").find("\"correlation\""),
            std::string::npos);
  EXPECT_NE(refusal(R"({"traceEvents": [)" + kernel(R"(, "grid": [1e300, 1, 1])") + "]}").find("grid"), std::string::npos);
  EXPECT_NE(refusal(R"({"traceEvents": [)" + kernel(R"(, "block": [4294967296, 1, 1])") + "]}").find("block"), std::string::npos);
  // Times whose sum with the base overflows int64_t.
  EXPECT_NE(refusal(R"({"baseTimeNanoseconds": 9200000000000000000, "traceEvents": [)" + kernel("", "3.9e15") + "]}")
                .find("out of range"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"baseTimeNanoseconds": -9200000000000000000, "traceEvents": [)" + kernel("", "-3.9e15") + "]}")
                .find("out of range"),
            std::string::npos);
}

TEST(TraceRobustness, DevicePropertiesBeyondTheirFieldsAreRefusedNotCast) {
  for (const char* doc : {R"({"deviceProperties": [{"id": 1e300}], "traceEvents": []})",
                          R"({"deviceProperties": [{"id": 18446744073709551615}], "traceEvents": []})",
                          R"({"deviceProperties": [{"id": 0, "numSms": 1e300}], "traceEvents": []})",
                          R"({"deviceProperties": [{"id": 0, "pcieWidth": -4}], "traceEvents": []})",
                          R"({"gpulab": {"dropped_records": 1e300}, "traceEvents": []})"})
    EXPECT_NE(refusal(doc).find("malformed trace"), std::string::npos) << doc << ": " << refusal(doc);
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
