// A plain std::thread parallel-for for the CPU references: fn(begin, end) over [0, n) in
// contiguous chunks, one per thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace gpulab::kernels {

template <class F>
void parallel_for(int64_t n, int threads, F&& fn) {
  const int64_t chunks = std::min<int64_t>(std::max(threads, 1), n);
  if (chunks <= 1) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(chunks);
  for (int64_t c = 0; c < chunks; ++c) pool.emplace_back([&, c] { fn(n * c / chunks, n * (c + 1) / chunks); });
  for (auto& t : pool) t.join();
}

}  // namespace gpulab::kernels
