#include "bench/chase.h"

#include <numeric>
#include <random>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/membench.h"

namespace gpulab::bench {

std::vector<uint32_t> random_cycle(size_t bytes, size_t spacing, uint64_t seed) {
  const size_t words = bytes / 4, step = spacing / 4, nodes = words / step;
  std::vector<uint32_t> order(nodes);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 rng(seed);
  for (size_t i = nodes - 1; i > 0; --i) std::swap(order[i], order[std::uniform_int_distribution<size_t>(0, i - 1)(rng)]);
  std::vector<uint32_t> next(words, 0);
  for (size_t i = 0; i < nodes; ++i) next[i * step] = uint32_t(order[i] * step);
  return next;
}

ChaseResult chase_latency(const uint32_t* next, long steps, int laps, cudaStream_t stream) {
  core::DeviceBuffer<kernels::ChaseTiming> timing(1);
  ChaseResult r;
  uint32_t start = 0;
  for (int lap = 0; lap < laps; ++lap) {
    kernels::pointer_chase(next, start, steps, timing.get(), stream);
    kernels::ChaseTiming t{};
    GPULAB_CHECK(cudaMemcpyAsync(&t, timing.get(), sizeof t, cudaMemcpyDeviceToHost, stream));
    GPULAB_CHECK(cudaStreamSynchronize(stream));
    r.ns_per_load.push_back(double(t.nanoseconds) / double(steps));
    r.cycles_per_load = double(t.cycles) / double(steps);
    start = t.end;  // the next lap goes on to nodes no lap has touched yet
  }
  return r;
}

}  // namespace gpulab::bench
