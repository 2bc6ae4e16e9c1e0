#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "bench/suite.h"
#include "bench/timing.h"
#include "core/error.h"

using namespace gpulab;
using namespace gpulab::bench;

TEST(Timing, HostTimingRepeatsAndMeasuresPerCall) {
  int calls = 0;
  const auto ms = time_on_host([&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }, {5, 1.0, 2.0});
  ASSERT_EQ(ms.size(), 5u);
  EXPECT_GE(calls, 1 + 5);  // the probe call, then at least one call per sample
  for (double t : ms) {
    EXPECT_GE(t, 0.3);
    EXPECT_LT(t, 50.0);  // generous: a loaded CI machine oversleeps
  }
}

TEST(Context, FinishPrintsLogsAndClearsRows) {
  std::ostringstream out;
  core::DeviceInfo device;
  device.name = "Test GPU";
  Datasheet sheet;
  sheet.bf16_tflops = 1000;
  Context ctx(Options{}, device, sheet, out);
  ctx.set_ceiling("gemm_bf16_8192", 800);
  EXPECT_DOUBLE_EQ(*ctx.ceiling("gemm_bf16_8192"), 800);
  EXPECT_FALSE(ctx.ceiling("nothing"));
  Row row = make_row("gemm", "ladder5_wgmma_bf16_8192", "throughput", "TFLOP/s", summarize({640, 650, 660}), sheet.bf16_tflops);
  row.ceiling = ctx.ceiling("gemm_bf16_8192");
  ctx.add(row);
  ctx.note("hello");
  ctx.finish("gemm");
  ctx.finish("empty");
  const std::string s = out.str();
  EXPECT_NE(s.find("== gemm =="), std::string::npos);
  EXPECT_NE(s.find("65.0"), std::string::npos) << s;  // 650 of 1000
  EXPECT_NE(s.find("81.2"), std::string::npos) << s;  // 650 of 800
  EXPECT_NE(s.find("note: hello"), std::string::npos);
  // The second table is empty: rows and notes went with the first.
  const std::string second = s.substr(s.find("== empty =="));
  EXPECT_EQ(second.find("wgmma"), std::string::npos);
  EXPECT_EQ(second.find("hello"), std::string::npos);
  ASSERT_EQ(ctx.log().results().size(), 1u);
  EXPECT_EQ(core::validate_result(ctx.log().results()[0]), "");
  EXPECT_NEAR(ctx.log().results()[0]["fraction"].get<double>(), 0.65, 1e-12);
}

TEST(Context, FailIsNotedAndRemembered) {
  std::ostringstream out;
  Context ctx(Options{}, core::DeviceInfo{}, Datasheet{}, out);
  EXPECT_FALSE(ctx.failed());
  ctx.fail("verification of x");
  ctx.finish("t");
  EXPECT_TRUE(ctx.failed());  // stays set after the table is printed
  EXPECT_NE(out.str().find("FAILED: verification of x"), std::string::npos);
}

TEST(Context, AttemptRecordsAThrowAndLetsTheSuiteGoOn) {
  std::ostringstream out;
  Context ctx(Options{}, core::DeviceInfo{}, Datasheet{}, out);
  int ran = 0;
  EXPECT_TRUE(ctx.attempt("first", [&] { ++ran; }));
  EXPECT_FALSE(ctx.failed());
  EXPECT_FALSE(ctx.attempt("ladder4 at 8192³", [&] { throw core::Error("launch failed"); }));
  EXPECT_TRUE(ctx.failed());
  EXPECT_TRUE(ctx.attempt("third", [&] { ++ran; }));  // still runs after the failure
  EXPECT_EQ(ran, 2);
  ctx.finish("t");
  EXPECT_NE(out.str().find("FAILED: ladder4 at 8192³: launch failed"), std::string::npos);
  EXPECT_TRUE(ctx.failed());
}
