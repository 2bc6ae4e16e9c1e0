#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace gpulab::core {

ProgressBar::ProgressBar(std::string label, uint64_t total)
    : label_(std::move(label)), total_(std::max<uint64_t>(total, 1)),
      enabled_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (!enabled_) return;
  draw(true);
  std::fputc('\n', stderr);
}

void ProgressBar::advance(uint64_t steps) { set(done_ + steps); }

void ProgressBar::set(uint64_t done) {
  done_ = std::min(done, total_);
  draw(false);
}

void ProgressBar::set_suffix(std::string suffix) { suffix_ = std::move(suffix); }

void ProgressBar::draw(bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100) && done_ != total_) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const double fraction = static_cast<double>(done_) / static_cast<double>(total_);
  const int filled = static_cast<int>(fraction * kWidth);
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %llu/%llu %.1fs %s\033[K", label_.c_str(), bar.c_str(),
               100.0 * fraction, static_cast<unsigned long long>(done_),
               static_cast<unsigned long long>(total_), elapsed, suffix_.c_str());
  std::fflush(stderr);
}

}  // namespace gpulab::core
