// A consumer's wait on an input pipeline that says where it stands: a loader that stops
// delivering (a stuck decoder, a lost wake-up, a GPU that never finishes) prints a warning
// every `every` naming what the loader was doing, instead of stalling silently. Past the stall
// timeout (--stall-timeout, GPULAB_STALL_TIMEOUT; 300 s by default) the process ends with one
// error line and exit status 1: a thread stuck inside a library call (nvJPEG, a CUDA
// synchronization) can be neither interrupted nor joined, so unwinding would hang as well.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "core/log.h"

namespace gpulab::data {

inline constexpr std::chrono::seconds kStallWarning{30};
inline constexpr std::chrono::seconds kStallTimeout{300};

// Process-wide; zero waits forever. Starts at GPULAB_STALL_TIMEOUT (seconds) when set, else kStallTimeout.
void set_stall_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds stall_timeout();

// Logs `why` as an error, flushes stdout and stderr, and ends the process with exit status 1
// at once (no destructors: they would join the stuck thread).
[[noreturn]] void end_stalled_process(const std::string& why);

// "0.05", "300": seconds as the log lines print them.
inline std::string seconds_text(std::chrono::milliseconds t) {
  std::ostringstream out;
  out << std::chrono::duration<double>(t).count();
  return out.str();
}

// cv.wait(lock, ready), logging `what()` (called with the lock held) and the time waited so
// far after each `every` without `ready()`; once that time reaches `give_up` (zero: never),
// calls `on_give_up` with the same line instead of warning.
template <class Ready, class What, class GiveUp = void (*)(const std::string&)>
void wait_or_warn(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Ready ready, What what,
                  std::chrono::milliseconds every = kStallWarning, std::chrono::milliseconds give_up = stall_timeout(),
                  GiveUp on_give_up = &end_stalled_process) {
  for (int periods = 1; !cv.wait_for(lock, every, ready); ++periods) {
    const std::chrono::milliseconds waited = every * periods;
    const std::string line = std::string(what()) + " (waited " + seconds_text(waited) + " s)";
    if (give_up.count() > 0 && waited >= give_up)
      on_give_up(line + "; ending the run (stall timeout " + seconds_text(give_up) + " s)");
    else
      core::log_warn(line);
  }
}

// The same policy for a wait that has no timeout of its own (a CUDA synchronization): a helper
// thread warns and gives up as wait_or_warn does while a watch() scope is open. Opening and
// closing a scope costs a lock and a notify; the thread sleeps between scopes.
class StallWatchdog {
 public:
  using What = std::function<std::string()>;  // called on the watchdog's thread
  explicit StallWatchdog(std::chrono::milliseconds every = kStallWarning,
                         std::chrono::milliseconds give_up = stall_timeout(),
                         std::function<void(const std::string&)> on_give_up = &end_stalled_process);
  ~StallWatchdog();
  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

  class Scope {
   public:
    explicit Scope(StallWatchdog& w) : w_(w) {}
    ~Scope() { w_.set(nullptr); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StallWatchdog& w_;
  };
  // Watched until the scope closes; one scope at a time.
  [[nodiscard]] Scope watch(What what) {
    set(std::move(what));
    return Scope(*this);
  }

 private:
  void set(What what);
  void run();

  std::chrono::milliseconds every_, give_up_;
  std::function<void(const std::string&)> on_give_up_;
  std::mutex mutex_;
  std::condition_variable cv_;
  What what_;
  uint64_t generation_ = 0;  // bumped by every open and close
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace gpulab::data
