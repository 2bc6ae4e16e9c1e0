// Runs fn(i) for every i in [0, n) on `threads` threads; the first exception is rethrown after
// all threads stop.
#pragma once

#include <cstdint>
#include <functional>

namespace gpulab::data {

void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn);

}  // namespace gpulab::data
