// Shared by the examples: a kernel that keeps every SM busy for a given time, so a program's
// GPU work has a known duration whatever the GPU model.
#pragma once

#include <cstdint>

// Every thread spins on the global nanosecond timer; the write keeps the loop from being removed.
__global__ void busy_kernel(uint64_t ns, float* sink) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  float acc = float(threadIdx.x);
  do {
    acc = acc * 0.999f + 1.0f;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  if (acc == -1.0f) sink[threadIdx.x] = acc;  // never true; the compiler cannot know
}

// Enough blocks to cover every SM several times over.
inline int busy_blocks(int sm_count) { return 8 * sm_count; }
