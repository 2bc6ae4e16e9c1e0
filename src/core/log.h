// Leveled logging to stderr. The level comes from GPULAB_LOG_LEVEL (error, warn, info, debug)
// or from --verbose/--quiet through set_log_level; the default is info.
#pragma once

#include <sstream>
#include <string>

namespace gpulab::core {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, const std::string& message);

template <class... Args>
void log(LogLevel level, const Args&... args) {
  if (level > log_level()) return;
  std::ostringstream out;
  (out << ... << args);
  log_line(level, out.str());
}
template <class... Args> void log_error(const Args&... a) { log(LogLevel::error, a...); }
template <class... Args> void log_warn(const Args&... a) { log(LogLevel::warn, a...); }
template <class... Args> void log_info(const Args&... a) { log(LogLevel::info, a...); }
template <class... Args> void log_debug(const Args&... a) { log(LogLevel::debug, a...); }

}  // namespace gpulab::core
