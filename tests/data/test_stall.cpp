// wait_or_warn: a consumer waiting on a stalled loader logs where the loader stands, a batch
// that arrives in time is waited for silently, and past the stall timeout the wait gives up
// (by default ending the process with one error line).
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

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

// Waits with a 20 ms warning period (giving up after `give_up`, zero: never) for a flag another
// thread sets after `delay`; returns stderr.
std::string wait_for_flag(std::chrono::milliseconds delay, std::chrono::milliseconds give_up = 0ms) {
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
                       20ms, give_up);
    EXPECT_TRUE(ready);
  }
  producer.join();
  return testing::internal::GetCapturedStderr();
}

}  // namespace

TEST(Stall, AStalledWaitSaysWhereTheLoaderStandsUntilTheBatchComes) {
  const std::string err = wait_for_flag(500ms);
  EXPECT_NE(err.find("warning: loader: stuck at step 1 (waited 0.02 s)"), std::string::npos) << err;
  EXPECT_NE(err.find("loader: stuck at step 3 (waited 0.06 s)"), std::string::npos) << err;
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

struct GaveUp : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(Stall, PastTheTimeoutTheWaitGivesUpWithWhereTheLoaderStands) {
  std::mutex mutex;
  std::condition_variable cv;
  int asked = 0;
  core::set_log_level(core::LogLevel::info);
  testing::internal::CaptureStderr();
  std::string why;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    std::unique_lock lock(mutex);
    data::wait_or_warn(cv, lock, [] { return false; }, [&] { return "loader: at batch " + std::to_string(++asked); }, 10ms,
                       50ms, [](const std::string& line) { throw GaveUp(line); });
    ADD_FAILURE() << "the wait returned without its flag";
  } catch (const GaveUp& e) {
    why = e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_GE(waited, 0.05);
  EXPECT_EQ(why, "loader: at batch 5 (waited 0.05 s); ending the run (stall timeout 0.05 s)");
  // Four warnings first, then the give-up line instead of a fifth.
  EXPECT_NE(err.find("warning: loader: at batch 4 (waited 0.04 s)"), std::string::npos) << err;
  EXPECT_EQ(err.find("batch 5"), std::string::npos) << err;
}

TEST(Stall, AZeroTimeoutWaitsForeverAndALateBatchStillArrives) {
  // 15 periods past where a 50 ms timeout would have given up: the flag still ends the wait.
  const std::string err = wait_for_flag(300ms, 0ms);
  EXPECT_NE(err.find("loader: stuck at step 3 (waited 0.06 s)"), std::string::npos) << err;
  EXPECT_EQ(err.find("ending the run"), std::string::npos) << err;
}

TEST(Stall, ABatchInsideTheTimeoutDoesNotEndTheWait) {
  const std::string err = wait_for_flag(30ms, 10s);
  EXPECT_EQ(err.find("ending the run"), std::string::npos) << err;
}

TEST(Stall, TheTimeoutIsProcessWideAndSettable) {
  const std::chrono::milliseconds before = data::stall_timeout();
  data::set_stall_timeout(1500ms);
  EXPECT_EQ(data::stall_timeout(), 1500ms);
  data::set_stall_timeout(0ms);
  EXPECT_EQ(data::stall_timeout(), 0ms);
  data::set_stall_timeout(before);
}

TEST(StallDeathTest, EndingAStalledProcessPrintsOneErrorAndExitsWithStatusOne) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(data::end_stalled_process("GPU loader: batch 74 not ready; the loader thread is at batch 74, decoding"),
              ::testing::ExitedWithCode(1), "error: GPU loader: batch 74 not ready; the loader thread is at batch 74, decoding");
}

TEST(StallDeathTest, TheDefaultGiveUpEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto stalled_wait = [] {
    std::mutex mutex;
    std::condition_variable cv;
    std::unique_lock lock(mutex);
    data::wait_or_warn(cv, lock, [] { return false; }, [] { return std::string("loader: stuck"); }, 5ms, 20ms);
  };
  EXPECT_EXIT(stalled_wait(), ::testing::ExitedWithCode(1), "error: loader: stuck \\(waited 0.02 s\\); ending the run");
}

TEST(StallWatchdog, AWatchedWaitWarnsUntilItsScopeCloses) {
  core::set_log_level(core::LogLevel::info);
  testing::internal::CaptureStderr();
  {
    data::StallWatchdog watchdog(20ms, 0ms);
    {
      auto scope = watchdog.watch([] { return std::string("training: step 7 has not finished on the GPU"); });
      std::this_thread::sleep_for(130ms);
    }
    std::this_thread::sleep_for(100ms);  // closed: no more warnings
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: training: step 7 has not finished on the GPU (waited 0.02 s)"), std::string::npos) << err;
  EXPECT_NE(err.find("(waited 0.06 s)"), std::string::npos) << err;
  EXPECT_EQ(err.find("(waited 0.2 s)"), std::string::npos) << err;
}

TEST(StallWatchdog, ScopesThatCloseInTimeAreSilent) {
  core::set_log_level(core::LogLevel::info);
  testing::internal::CaptureStderr();
  {
    data::StallWatchdog watchdog(50ms, 0ms);
    for (int i = 0; i < 200; ++i) {
      auto scope = watchdog.watch([] { return std::string("never"); });
      std::this_thread::sleep_for(1ms);
    }
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(StallWatchdog, PastTheTimeoutAWatchedWaitGivesUp) {
  std::mutex mutex;
  std::vector<std::string> lines;
  core::set_log_level(core::LogLevel::error);  // the warnings before it are not this test's
  {
    data::StallWatchdog watchdog(10ms, 40ms, [&](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    });
    int step = 0;
    auto scope = watchdog.watch([&] { return "training: step " + std::to_string(++step) + " has not finished"; });
    std::this_thread::sleep_for(150ms);
  }
  core::set_log_level(core::LogLevel::info);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "training: step 4 has not finished (waited 0.04 s); ending the run (stall timeout 0.04 s)");
}

TEST(StallDeathTest, AWatchdogPastTheTimeoutEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto stuck = [] {
    data::StallWatchdog watchdog(5ms, 20ms);
    auto scope = watchdog.watch([] { return std::string("training: step 3 has not finished on the GPU"); });
    std::this_thread::sleep_for(10s);
  };
  EXPECT_EXIT(stuck(), ::testing::ExitedWithCode(1), "error: training: step 3 has not finished on the GPU \\(waited 0.02 s\\)");
}
