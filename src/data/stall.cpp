#include "data/stall.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "core/error.h"

namespace gpulab::data {

namespace {

std::chrono::milliseconds timeout_from_env() {
  const char* env = std::getenv("GPULAB_STALL_TIMEOUT");
  if (!env || !*env) return kStallTimeout;
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (*end || !(seconds >= 0)) {
    core::log_warn("GPULAB_STALL_TIMEOUT=", env, " is not a number of seconds; using ", kStallTimeout.count(), " s");
    return kStallTimeout;
  }
  return std::chrono::milliseconds(int64_t(seconds * 1000));
}

std::atomic<int64_t>& timeout_ms() {
  static std::atomic<int64_t> ms{timeout_from_env().count()};
  return ms;
}

}  // namespace

void set_stall_timeout(std::chrono::milliseconds timeout) { timeout_ms() = timeout.count(); }
std::chrono::milliseconds stall_timeout() { return std::chrono::milliseconds(timeout_ms().load()); }

void end_stalled_process(const std::string& why) {
  std::cout.flush();
  std::fflush(stdout);
  core::log_error(why);
  std::cerr.flush();
  std::fflush(stderr);
  std::_Exit(core::kExitFailure);
}

StallWatchdog::StallWatchdog(std::chrono::milliseconds every, std::chrono::milliseconds give_up,
                             std::function<void(const std::string&)> on_give_up)
    : every_(every), give_up_(give_up), on_give_up_(std::move(on_give_up)), thread_([this] { run(); }) {}

StallWatchdog::~StallWatchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StallWatchdog::set(What what) {
  {
    std::lock_guard lock(mutex_);
    what_ = std::move(what);
    ++generation_;
  }
  cv_.notify_all();
}

void StallWatchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    cv_.wait(lock, [&] { return stop_ || what_; });
    if (stop_) return;
    const uint64_t watched = generation_;
    wait_or_warn(cv_, lock, [&] { return stop_ || generation_ != watched; }, [&] { return what_(); }, every_, give_up_,
                 on_give_up_);
  }
}

}  // namespace gpulab::data
