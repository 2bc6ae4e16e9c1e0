// Summaries of repeated timings: median and spread, computed in plain C++ so CPU tests cover them.
#pragma once

#include <cstddef>
#include <vector>

namespace gpulab::bench {

struct Summary {
  size_t count = 0;
  double median = 0, min = 0, max = 0, p10 = 0, p90 = 0;
};

// Percentile p in [0, 100] by linear interpolation between the closest ranks (numpy's default).
// Throws core::Error on an empty sample.
double percentile(std::vector<double> samples, double p);
Summary summarize(const std::vector<double>& samples);

}  // namespace gpulab::bench
