// Rotary position embedding in place, Hugging Face rotate_half convention: within each head the
// pairs (i, i + head_dim/2) rotate by angle positions[t] · inv_freq[i]. Rows of `x` are
// `stride` elements apart (q or k inside a fused QKV row), heads are contiguous in a row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

struct RopeTarget {
  void* x;
  int64_t stride;  // elements between rows
  int64_t heads;
};

// Also stores each token's rotated keys and its values (rows of k.heads · head_dim) in cache
// slot slots[t] (negative: nowhere), as kv_cache_write would after rope, one launch fewer.
struct RopeCacheWrite {
  void* k_cache;
  void* v_cache;
  const void* v;
  int64_t v_stride;  // elements between rows of v
  const int32_t* slots;
};

// The angles of every position below `positions`: table[p · head_dim/2 + i] = (cos, sin) of
// p · inv_freq[i] (inv_freq: a device array of head_dim / 2 floats), computed once for a model.
void rope_table(float2* table, const float* inv_freq, int64_t positions, int64_t head_dim, cudaStream_t stream);

// Rotates q and k of `tokens` rows by the angles of positions[t] in a rope_table (which must
// cover every position given).
void rope(RopeTarget q, RopeTarget k, const int32_t* positions, const float2* table, int64_t tokens,
          int64_t head_dim, core::DType dtype, cudaStream_t stream, const RopeCacheWrite* cache = nullptr);

void rope_ref(float* x, int64_t stride, int64_t heads, const int32_t* positions, const float* inv_freq,
              int64_t tokens, int64_t head_dim);

}  // namespace gpulab::kernels
