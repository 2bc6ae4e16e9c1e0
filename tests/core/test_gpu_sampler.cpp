#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/gpu_sampler.h"

using namespace gpulab::core;
using namespace std::chrono_literals;

// Readings as the session-25 H200 gave them during a 70B fp8 decode: at the power cap, clocks
// swinging well below the maximum, one reading also thermally slowed.
TEST(GpuSampler, SummaryNamesTheClocksAndWhyTheyWereLow) {
  const std::vector<GpuReading> readings = {
      {1785, 694.9, 56, kClocksSoftwarePowerCap},
      {1455, 696.6, 53, kClocksSoftwarePowerCap},
      {1620, 700.7, 53, kClocksSoftwarePowerCap | kClocksSoftwareThermal},
      {1980, 90.7, 40, 0},
      {1665, std::nullopt, std::nullopt, std::nullopt},  // a reading without power or reasons
  };
  const std::optional<ClockSummary> s = summarize_clocks(readings);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->samples, 5u);
  EXPECT_DOUBLE_EQ(s->sm_clock_mhz_median, 1665);
  EXPECT_DOUBLE_EQ(s->sm_clock_mhz_min, 1455);
  EXPECT_DOUBLE_EQ(s->sm_clock_mhz_max, 1980);
  ASSERT_TRUE(s->power_w_median);
  EXPECT_DOUBLE_EQ(*s->power_w_median, (694.9 + 696.6) / 2);  // 4 readings: the middle two
  EXPECT_DOUBLE_EQ(s->power_cap_share, 3.0 / 4);  // of the 4 readings with a reason mask
  EXPECT_DOUBLE_EQ(s->thermal_share, 1.0 / 4);
  EXPECT_DOUBLE_EQ(s->power_brake_share, 0);
}

TEST(GpuSampler, NoClockReadingsGiveNoSummary) {
  EXPECT_FALSE(summarize_clocks({}));
  EXPECT_FALSE(summarize_clocks({GpuReading{std::nullopt, 300.0, 50, 0}}));  // NVML without clocks
}

TEST(GpuSampler, ReadsUntilStoppedAndOnceMoreAtTheEnd) {
  std::atomic<int> calls{0};
  GpuSampler sampler(
      [&] {
        const int n = ++calls;
        return GpuReading{static_cast<unsigned>(n), std::nullopt, std::nullopt, std::nullopt};
      },
      1ms);
  while (calls < 5) std::this_thread::sleep_for(1ms);
  const std::vector<GpuReading> readings = sampler.stop();
  ASSERT_GE(readings.size(), 6u);  // at least the 5 waited for and the last one
  EXPECT_EQ(static_cast<int>(readings.size()), calls.load());
  for (size_t i = 0; i < readings.size(); ++i) EXPECT_EQ(*readings[i].sm_clock_mhz, i + 1) << "in order";
  EXPECT_EQ(sampler.stop().size(), readings.size()) << "a second stop reads nothing more";
}

TEST(GpuSampler, StopsPromptlyWithALongPeriod) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    GpuSampler sampler([] { return GpuReading{}; }, 1h);
    std::this_thread::sleep_for(5ms);
  }  // the destructor stops it: the hour's wait must not hold it
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}
