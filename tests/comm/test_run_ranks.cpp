#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"

namespace gpulab::comm {
namespace {

using namespace std::chrono_literals;

TEST(RunRanks, EveryRankRunsOnItsOwnThread) {
  std::vector<std::atomic<int>> ran(6);
  std::vector<std::thread::id> ids(6);
  run_ranks(6, [&](int r) {
    ++ran[size_t(r)];
    ids[size_t(r)] = std::this_thread::get_id();
    EXPECT_FALSE(cancelled());
  });
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(ran[size_t(r)].load(), 1);
    EXPECT_NE(ids[size_t(r)], std::this_thread::get_id());
    for (int q = 0; q < r; ++q) EXPECT_NE(ids[size_t(r)], ids[size_t(q)]);
  }
  EXPECT_FALSE(cancelled()) << "the caller is not in the group";
}

TEST(RunRanks, TheFirstFailureIsRethrownAndTheOthersAreCancelled) {
  std::atomic<int> saw_cancel{0};
  const auto start = std::chrono::steady_clock::now();
  try {
    run_ranks(4, [&](int r) {
      if (r == 2) {
        std::this_thread::sleep_for(50ms);
        throw core::InputError("rank 2 broke");
      }
      // The others stand for ranks blocked in a collective: they end only through cancelled().
      while (!cancelled()) {
        if (std::chrono::steady_clock::now() - start > 10s) return;
        std::this_thread::sleep_for(1ms);
      }
      ++saw_cancel;
      throw core::Error("rank " + std::to_string(r) + " stopped because another rank failed");
    });
    FAIL() << "expected the failure to propagate";
  } catch (const core::InputError& e) {
    EXPECT_STREQ(e.what(), "rank 2 broke");
  }
  EXPECT_EQ(saw_cancel.load(), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// A watchdog that gives up cancels its siblings before its own abort and throw: their "stopped"
// errors land first, but the error rethrown is the cause's.
TEST(RunRanks, TheRankThatCancelsIsTheCauseEvenWhenItsErrorLandsLast) {
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> stopped{0};
  try {
    run_ranks(3, [&](int r) {
      if (r == 1) {
        cancel_group();
        while (stopped < 2 && std::chrono::steady_clock::now() - start < 10s) std::this_thread::sleep_for(1ms);
        throw core::Error("rank 1: no progress (the cause)");
      }
      while (!cancelled()) std::this_thread::sleep_for(1ms);
      ++stopped;
      throw core::Error("rank " + std::to_string(r) + " stopped because another rank failed");
    });
    FAIL() << "expected rank 1's error";
  } catch (const core::Error& e) {
    EXPECT_STREQ(e.what(), "rank 1: no progress (the cause)");
  }
  EXPECT_EQ(stopped.load(), 2);
  cancel_group();  // outside a group: nothing
  EXPECT_FALSE(cancelled());
}

TEST(RunRanks, RejectsAnEmptyGroup) { EXPECT_THROW(run_ranks(0, [](int) {}), core::InputError); }

}  // namespace
}  // namespace gpulab::comm
