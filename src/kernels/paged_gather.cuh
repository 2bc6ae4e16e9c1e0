// The tensor-core attention kernels' copy of paged K/V rows into shared memory. Device code only;
// include from .cu files.
#pragma once

#include <cstdint>

#include "kernels/mma_ptx.h"

namespace gpulab::kernels {

// Gathers kRows positions of one kv head's keys or values from the paged cache (layout in
// attention.h) into a [kRows][ldmatrix_pitch<D>()] tile of shared memory, kThreads threads each
// copying 16-byte chunk `chunk` of rows row0, row0 + kStep, ... with cp.async. find() looks the
// rows' cache slots up once (for K); load() copies K or V with them. Positions at or past the
// sequence's length load zeros, so that masked positions meet finite values.
template <class T, int D, int kThreads, int kRows>
struct PagedGather {
  static constexpr int kChunks = D / 8;             // 16-byte chunks per row
  static constexpr int kStep = kThreads / kChunks;  // rows per cp.async wave
  static constexpr int kWaves = kRows / kStep;      // waves per tile
  static_assert(kThreads % kChunks == 0 && kRows % kStep == 0, "whole copy waves per tile");

  int chunk = threadIdx.x % kChunks, row0 = threadIdx.x / kChunks;
  int slots[kWaves];

  // The slots of positions first + row0 + w·kStep; -1 at or past len.
  __device__ void find(const int32_t* table, int block_size, int first, int len) {
#pragma unroll
    for (int w = 0; w < kWaves; ++w) {
      const int pos = first + row0 + w * kStep;
      slots[w] = pos < len ? table[pos / block_size] * block_size + pos % block_size : -1;
    }
  }

  __device__ void load(const T* cache, int kv_heads, int kvh, T* dst) const {
    load_if(cache, kv_heads, kvh, dst, [](int) { return true; });
  }

  // load() of the tile rows r for which copy(r) holds; the others are left as they are.
  template <class Pred>
  __device__ void load_if(const T* cache, int kv_heads, int kvh, T* dst, Pred copy) const {
#pragma unroll
    for (int w = 0; w < kWaves; ++w) {
      if (!copy(row0 + w * kStep)) continue;
      const bool ok = slots[w] >= 0;
      const T* src = ok ? cache + (static_cast<int64_t>(slots[w]) * kv_heads + kvh) * D + chunk * 8 : cache;
      cp_async16_or_zero(smem_addr(dst + (row0 + w * kStep) * ldmatrix_pitch<D>() + chunk * 8), src, ok);
    }
  }
};

}  // namespace gpulab::kernels
