#include "kernels/membench.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kernels/pdl.h"

namespace gpulab::kernels {

namespace {

constexpr int kThreads = 256;

int default_blocks(int blocks) {
  if (blocks > 0) return blocks;
  return current_sm_count() * 8;  // 8 blocks of 256 per SM: 2048 threads, full occupancy for these kernels
}

void require_16(size_t bytes) {
  if (bytes % 16) throw core::InputError("memory probe size " + std::to_string(bytes) + " is not a multiple of 16 bytes");
}

// Four independent 16-byte loads in flight per thread before the first store.
__global__ void copy_kernel(int4* __restrict__ dst, const int4* __restrict__ src, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

__global__ void read_kernel(const int4* __restrict__ src, size_t n, int passes, uint32_t* sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int p = 0; p < passes; ++p) {
    size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
      int4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = src[i + u * stride];
#pragma unroll
      for (int u = 0; u < 4; ++u) acc ^= uint32_t(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
    }
    for (; i < n; i += stride) {
      const int4 v = src[i];
      acc ^= uint32_t(v.x ^ v.y ^ v.z ^ v.w);
    }
  }
  // The xor over all threads is the xor of every word read (passes included).
  for (int o = 16; o; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(sink, acc);
}

__global__ void write_kernel(int4* __restrict__ dst, size_t n, uint32_t value) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const int v = int(value);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = make_int4(v, v, v, v);
}

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void chase_kernel(const uint32_t* __restrict__ next, uint32_t start, long steps, ChaseTiming* out) {
  uint32_t j = start;
  for (long s = 0; s < steps; ++s) j = next[j];  // untimed: caches and TLB as in steady state
  const unsigned long long c0 = clock64(), t0 = global_ns();
  for (long s = 0; s < steps; ++s) j = next[j];
  const unsigned long long c1 = clock64(), t1 = global_ns();
  *out = ChaseTiming{j, 0, c1 - c0, t1 - t0};  // the padding too: the host copies the whole struct
}

__global__ void nothing_kernel() {}

}  // namespace

void stream_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, int blocks) {
  require_16(bytes);
  copy_kernel<<<default_blocks(blocks), kThreads, 0, stream>>>(static_cast<int4*>(dst), static_cast<const int4*>(src), bytes / 16);
  GPULAB_CHECK_LAUNCH();
}

void stream_read(const void* src, size_t bytes, int passes, uint32_t* sink, cudaStream_t stream, int blocks) {
  require_16(bytes);
  read_kernel<<<default_blocks(blocks), kThreads, 0, stream>>>(static_cast<const int4*>(src), bytes / 16, passes, sink);
  GPULAB_CHECK_LAUNCH();
}

void stream_write(void* dst, size_t bytes, uint32_t value, cudaStream_t stream, int blocks) {
  require_16(bytes);
  write_kernel<<<default_blocks(blocks), kThreads, 0, stream>>>(static_cast<int4*>(dst), bytes / 16, value);
  GPULAB_CHECK_LAUNCH();
}

void pointer_chase(const uint32_t* next, uint32_t start, long steps, ChaseTiming* out, cudaStream_t stream) {
  chase_kernel<<<1, 1, 0, stream>>>(next, start, steps, out);
  GPULAB_CHECK_LAUNCH();
}

void empty_kernel(cudaStream_t stream) {
  nothing_kernel<<<1, 1, 0, stream>>>();
  GPULAB_CHECK_LAUNCH();
}

const void* empty_kernel_function() { return reinterpret_cast<const void*>(&nothing_kernel); }

}  // namespace gpulab::kernels
