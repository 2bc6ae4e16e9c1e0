#include "bench/stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace gpulab::bench {

namespace {

double sorted_percentile(const std::vector<double>& s, double p) {
  const double rank = p / 100.0 * static_cast<double>(s.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, s.size() - 1);
  return s[lo] + (rank - static_cast<double>(lo)) * (s[hi] - s[lo]);
}

}  // namespace

double percentile(std::vector<double> samples, double p) {
  if (samples.empty()) throw core::Error("percentile of an empty sample");
  if (p < 0 || p > 100) throw core::Error("percentile outside [0, 100]");
  std::sort(samples.begin(), samples.end());
  return sorted_percentile(samples, p);
}

Summary summarize(const std::vector<double>& samples) {
  if (samples.empty()) throw core::Error("summary of an empty sample");
  std::vector<double> s = samples;
  std::sort(s.begin(), s.end());
  return {s.size(), sorted_percentile(s, 50), s.front(), s.back(), sorted_percentile(s, 10),
          sorted_percentile(s, 90)};
}

}  // namespace gpulab::bench
