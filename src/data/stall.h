// A consumer's wait on an input pipeline that says where it stands: a loader that stops
// delivering (a stuck decoder, a lost wake-up, a GPU that never finishes) prints a warning
// every `every` naming what the loader was doing, instead of stalling silently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "core/log.h"

namespace gpulab::data {

inline constexpr std::chrono::seconds kStallWarning{30};

// cv.wait(lock, ready), logging `what()` (called with the lock held) and the time waited so
// far after each `every` without `ready()`.
template <class Ready, class What>
void wait_or_warn(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Ready ready, What what,
                  std::chrono::milliseconds every = kStallWarning) {
  for (int periods = 1; !cv.wait_for(lock, every, ready); ++periods)
    core::log_warn(what(), " (no batch for ", std::chrono::duration<double>(every * periods).count(), " s)");
}

}  // namespace gpulab::data
