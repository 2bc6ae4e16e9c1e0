// A progress bar on stderr for anything longer than a few seconds. Silent when stderr is not
// a terminal (logs, CI), so output that is piped stays clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace gpulab::core {

class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total);
  ~ProgressBar();  // finishes the line
  void advance(uint64_t steps = 1);
  void set(uint64_t done);
  void set_suffix(std::string suffix);  // e.g. "312 tok/s"
  bool enabled() const { return enabled_; }

 private:
  void draw(bool force);
  std::string label_;
  std::string suffix_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace gpulab::core
