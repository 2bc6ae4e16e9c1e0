// wait_or_warn: a consumer waiting on a stalled loader logs where the loader stands, and a
// batch that arrives in time is waited for silently.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "core/log.h"
#include "data/stall.h"

using namespace gpulab;
using namespace std::chrono_literals;

namespace {

// Waits with a 20 ms warning period for a flag another thread sets after `delay`; returns stderr.
std::string wait_for_flag(std::chrono::milliseconds delay) {
  std::mutex mutex;
  std::condition_variable cv;
  bool ready = false;
  int asked = 0;
  core::set_log_level(core::LogLevel::info);
  testing::internal::CaptureStderr();
  std::thread producer([&] {
    std::this_thread::sleep_for(delay);
    {
      std::lock_guard lock(mutex);
      ready = true;
    }
    cv.notify_all();
  });
  {
    std::unique_lock lock(mutex);
    data::wait_or_warn(cv, lock, [&] { return ready; }, [&] { return "loader: stuck at step " + std::to_string(++asked); },
                       20ms);
    EXPECT_TRUE(ready);
  }
  producer.join();
  return testing::internal::GetCapturedStderr();
}

}  // namespace

TEST(Stall, AStalledWaitSaysWhereTheLoaderStandsUntilTheBatchComes) {
  const std::string err = wait_for_flag(500ms);
  EXPECT_NE(err.find("warning: loader: stuck at step 1 (no batch for 0.02 s)"), std::string::npos) << err;
  EXPECT_NE(err.find("loader: stuck at step 3 (no batch for 0.06 s)"), std::string::npos) << err;
}

TEST(Stall, ABatchThatComesInTimeIsWaitedForSilently) {
  // Well inside one period, however slow the machine: the flag is set before the first check.
  std::mutex mutex;
  std::condition_variable cv;
  core::set_log_level(core::LogLevel::info);
  testing::internal::CaptureStderr();
  {
    std::unique_lock lock(mutex);
    data::wait_or_warn(cv, lock, [] { return true; }, [] { return std::string("never"); }, 1ms);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}
