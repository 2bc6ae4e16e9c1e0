// Bandwidth and latency probes for `gpulab bench memory` / `p2p` / `launch`: streaming copy,
// read-only and write-only kernels with 16-byte accesses per thread, a pointer chase, an empty
// kernel. Sizes are in bytes and must be multiples of 16 (InputError otherwise).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gpulab::kernels {

// dst[i] = src[i] over `bytes`, grid-stride with 16-byte loads and stores. `blocks` 0 = enough to
// fill the device.
void stream_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, int blocks = 0);
// Reads `bytes` of src `passes` times; folds what it read into *sink (so nothing is elided):
// sink gets the xor of every 32-bit word read, taken over all passes.
void stream_read(const void* src, size_t bytes, int passes, uint32_t* sink, cudaStream_t stream,
                 int blocks = 0);
// dst's 32-bit words all become `value`.
void stream_write(void* dst, size_t bytes, uint32_t value, cudaStream_t stream, int blocks = 0);

// One thread follows next[] `steps` times from index `start` (untimed: warms caches and TLB), then
// `steps` more (timed), and writes the final index to *end and the elapsed SM cycles and
// nanoseconds of the timed part.
struct ChaseTiming {
  uint32_t end;
  uint32_t pad;
  unsigned long long cycles;
  unsigned long long nanoseconds;
};
void pointer_chase(const uint32_t* next, uint32_t start, long steps, ChaseTiming* out, cudaStream_t stream);

// A kernel that does nothing (launch-overhead probes).
void empty_kernel(cudaStream_t stream);
// The kernel's address, for capturing it into graphs by hand.
const void* empty_kernel_function();

}  // namespace gpulab::kernels
