#include "kernels/rope.h"

#include <algorithm>

#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "kernels/pdl.h"
#include "kernels/rope.cuh"

namespace gpulab::kernels {

namespace {

// One block per token; threads over (head, i < half) of q then k (then, with a cache, the
// value pairs to copy).
template <class T>
__global__ void rope_kernel(T* q, int64_t q_stride, int64_t q_heads, T* k, int64_t k_stride, int64_t k_heads,
                            const int32_t* positions, const float2* table, int64_t half, RopeCacheWrite cache) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t t = blockIdx.x;
  const float2* angles = table + positions[t] * half;
  const int64_t slot = cache.slots ? cache.slots[t] : -1;
  const int64_t q_pairs = q_heads * half, rotated = (q_heads + k_heads) * half;
  const int64_t all_pairs = rotated + (cache.slots ? k_heads * half : 0);
  const int64_t width = k_heads * 2 * half;  // a cache row
  // A token's pairs spread over gridDim.y blocks, one pair a thread: decode rotates few tokens.
  for (int64_t p = blockIdx.y * int64_t(blockDim.x) + threadIdx.x; p < all_pairs;
       p += int64_t(gridDim.y) * blockDim.x) {
    if (p >= rotated) {  // a value pair: copied as it is
      if (slot < 0) continue;
      const int64_t head = (p - rotated) / half, i = (p - rotated) % half;
      const T* v = static_cast<const T*>(cache.v) + t * cache.v_stride + head * 2 * half;
      T* to = static_cast<T*>(cache.v_cache) + slot * width + head * 2 * half;
      to[i] = v[i];
      to[i + half] = v[i + half];
      continue;
    }
    const bool is_q = p < q_pairs;
    const int64_t pp = is_q ? p : p - q_pairs;
    const int64_t head = pp / half, i = pp % half;
    T* v = (is_q ? q + t * q_stride : k + t * k_stride) + head * 2 * half;
    const float a = static_cast<float>(v[i]), b = static_cast<float>(v[i + half]);
    v[i] = static_cast<T>(rope_element(a, b, angles[i], true));
    v[i + half] = static_cast<T>(rope_element(b, a, angles[i], false));
    if (!is_q && slot >= 0) {
      T* to = static_cast<T*>(cache.k_cache) + slot * width + head * 2 * half;
      to[i] = v[i];
      to[i + half] = v[i + half];
    }
  }
}

// One (position, frequency) pair a thread.
__global__ void rope_table_kernel(float2* table, const float* inv_freq, int64_t positions, int64_t half) {
  for (int64_t at = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; at < positions * half;
       at += int64_t(gridDim.x) * blockDim.x) {
    float2 cs;
    sincosf(static_cast<float>(at / half) * inv_freq[at % half], &cs.y, &cs.x);
    table[at] = cs;
  }
}

}  // namespace

void rope_table(float2* table, const float* inv_freq, int64_t positions, int64_t head_dim, cudaStream_t stream) {
  if (positions == 0) return;
  const int64_t half = head_dim / 2, blocks = std::min<int64_t>((positions * half + 255) / 256, 4096);
  rope_table_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(table, inv_freq, positions, half);
  GPULAB_CHECK_LAUNCH();
}

void rope(RopeTarget q, RopeTarget k, const int32_t* positions, const float2* table, int64_t tokens,
          int64_t head_dim, core::DType dtype, cudaStream_t stream, const RopeCacheWrite* cache) {
  if (tokens == 0) return;
  core::dispatch_activation(dtype, [&]<class T>() {
    const int64_t pairs = (q.heads + k.heads * (cache ? 2 : 1)) * (head_dim / 2);
    const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(std::min<int64_t>((pairs + 255) / 256, 64)));
    launch_overlapped(rope_kernel<T>, grid, dim3(256), 0, stream, static_cast<T*>(q.x), q.stride, q.heads,
                      static_cast<T*>(k.x), k.stride, k.heads, positions, table, head_dim / 2,
                      cache ? *cache : RopeCacheWrite{});
  });
}

}  // namespace gpulab::kernels
