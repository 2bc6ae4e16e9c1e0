// How far an all-reduced average of the ranks' gradients may lie from the exact average, by the
// dtype on the wire: each rank's share (gradient / world) rounded into it, and world - 1 sums
// rounded in it, each at most one unit roundoff u of the magnitudes summed (plus, for fp16, half
// a subnormal step). The bound is twice that: 2 (world + 1) u mean|g| + 2 world tiny. A missing
// or repeated bucket, a read before backward wrote, a sum where an average belongs, all miss it by
// far. The GPU tests check every element of every step with it; tests/train/test_allreduce_check.cpp
// checks it against an emulated reduction on the CPU.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "core/dtype.h"

namespace gpulab::train::fixtures {

struct AverageCheck {
  size_t bad = 0;    // elements outside the bound
  size_t first = 0;  // the first of them
  double got = 0, want = 0, bound = 0;  // at `first`
};

// `locals`: each rank's gradients before the reduction; `reduced`: one rank's after it.
inline AverageCheck check_average(const std::vector<std::vector<float>>& locals, const std::vector<float>& reduced,
                                  core::DType wire) {
  const double u = wire == core::DType::bf16 ? std::ldexp(1.0, -8) : wire == core::DType::f16 ? std::ldexp(1.0, -11)
                                                                                              : std::ldexp(1.0, -24);
  const double tiny = wire == core::DType::f16 ? std::ldexp(1.0, -25) : 1e-37;  // fp32: denormals flushed
  const double world = double(locals.size());
  AverageCheck c;
  for (size_t i = 0; i < reduced.size(); ++i) {
    double sum = 0, magnitude = 0;
    for (const auto& l : locals) sum += l[i], magnitude += std::fabs(double(l[i]));
    const double want = sum / world, bound = 2 * (world + 1) * u * magnitude / world + 2 * world * tiny;
    if (!(std::fabs(double(reduced[i]) - want) <= bound) && c.bad++ == 0) c.first = i, c.got = reduced[i], c.want = want, c.bound = bound;
  }
  return c;
}

}  // namespace gpulab::train::fixtures
