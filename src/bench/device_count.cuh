// Shared pieces of the bench's verification kernels: a grid for grid-stride loops, and counting
// on the device (a zeroed counter, a kernel that adds to it, the total read back).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "core/memory.h"

namespace gpulab::bench {

constexpr int kGridStrideThreads = 256;

// Blocks of kGridStrideThreads for n elements, capped: the kernels loop over the rest.
inline int grid_stride_blocks(uint64_t n) {
  return int(std::clamp<uint64_t>((n + kGridStrideThreads - 1) / kGridStrideThreads, 1, 65536));
}

// Runs launch(counter) on `stream` with a zeroed device counter and returns its final value.
template <class Launch>
uint64_t count_on_device(cudaStream_t stream, Launch&& launch) {
  core::DeviceBuffer<unsigned long long> counter(1);
  GPULAB_CHECK(cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), stream));
  launch(counter.get());
  GPULAB_CHECK_LAUNCH();
  unsigned long long host = 0;
  GPULAB_CHECK(cudaMemcpyAsync(&host, counter.get(), sizeof host, cudaMemcpyDeviceToHost, stream));
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace gpulab::bench
