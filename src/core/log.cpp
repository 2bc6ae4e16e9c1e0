#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace gpulab::core {

namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("GPULAB_LOG_LEVEL");
  if (!env) return LogLevel::info;
  if (!std::strcmp(env, "error")) return LogLevel::error;
  if (!std::strcmp(env, "warn")) return LogLevel::warn;
  if (!std::strcmp(env, "debug")) return LogLevel::debug;
  return LogLevel::info;
}

std::atomic<LogLevel>& current_level() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

}  // namespace

void set_log_level(LogLevel level) { current_level() = level; }
LogLevel log_level() { return current_level(); }

void log_line(LogLevel level, const std::string& message) {
  static std::mutex mutex;
  static constexpr const char* kPrefix[] = {"error: ", "warning: ", "", "debug: "};
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "%s%s\n", kPrefix[static_cast<int>(level)], message.c_str());
}

}  // namespace gpulab::core
