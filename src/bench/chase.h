// Load latency by pointer chasing: one thread follows a single random cycle (each load depends on
// the last, and no prefetcher can guess the next line), lap after lap continuing where the last
// stopped, so a cycle larger than the L2 is never revisited and measures memory, not L2.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpulab::bench {

// A single random cycle (Sattolo) through `bytes / spacing` nodes spaced `spacing` bytes apart:
// next[i] is the index (in 32-bit words) of the node after i.
std::vector<uint32_t> random_cycle(size_t bytes, size_t spacing, uint64_t seed);

struct ChaseResult {
  std::vector<double> ns_per_load;  // one figure per lap
  double cycles_per_load = 0;       // SM cycles, last lap
};

// `laps` timed laps of `steps` loads each through `next` (device memory, a random_cycle's
// contents), each preceded by an untimed lap of `steps` loads that warms caches and TLB.
ChaseResult chase_latency(const uint32_t* next, long steps, int laps, cudaStream_t stream);

}  // namespace gpulab::bench
