// The newest position of each sequence for the decode split kernels (CUDA-core and tensor-core):
// from the cache, or with PagedKv::append from the new token, which the block whose split holds
// the newest position rotates by rope and stores in the cache. Include from .cu files.
#pragma once

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/rope.cuh"

namespace gpulab::kernels {

// DecodeAppend typed for the kernels, with the cache; k is null where the decode does not append.
template <class T>
struct NewTokens {
  const T* k = nullptr;
  const T* v = nullptr;
  int64_t k_stride = 0, v_stride = 0;
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  const float2* rope_table = nullptr;
  T* k_cache = nullptr;  // the cache the split kernels read through PagedKv, written at slots
  T* v_cache = nullptr;

  // The rope angle of element i of sequence seq's new token, for q's heads and the key alike
  // (entry i % (D/2) of its position's row of the rope table); only where the decode appends.
  // The positions are metadata: with PagedKv::settled it may be read before pdl_wait.
  template <int D>
  __device__ float2 angle(int seq, int i) const {
    return rope_table[static_cast<int64_t>(positions[seq]) * (D / 2) + i % (D / 2)];
  }

  // Element i of the newest position's key and value (kv head kvh of sequence seq): the new
  // token's, rotated by cs (angle(seq, i)) and stored at its slot, where the decode appends; else
  // the cache's, at cache_slot (the position's slot by the block table).
  template <int D>
  __device__ void newest(int seq, int kvh, int kv_heads, int64_t cache_slot, int i, float2 cs, T& key,
                         T& value) const {
    if (k) {
      // Every load before the first store: the key's and value's loads and the slot's travel
      // together (a store to the cache could alias a later load, which would then wait for it).
      const int32_t slot = slots[seq];
      const T* key_row = k + seq * k_stride + static_cast<int64_t>(kvh) * D;
      value = v[seq * v_stride + static_cast<int64_t>(kvh) * D + i];
      key = rope_at<T, D>(key_row, i, cs);
      if (slot >= 0) {
        const int64_t at = (static_cast<int64_t>(slot) * kv_heads + kvh) * D + i;
        k_cache[at] = key;
        v_cache[at] = value;
      }
      return;
    }
    const int64_t at = (cache_slot * kv_heads + kvh) * D + i;
    key = k_cache[at];
    value = v_cache[at];
  }

  // Element i of q row `seq`'s head `head` as rope() leaves it, rotated by cs (angle(seq, i))
  // where the decode appends (else not rotated, and cs is not read).
  template <int D>
  __device__ float q_at(const T* q, int64_t q_stride, int seq, int head, int i, float2 cs) const {
    const T* row = q + seq * q_stride + static_cast<int64_t>(head) * D;
    return static_cast<float>(k ? rope_at<T, D>(row, i, cs) : row[i]);
  }
};

template <class T>
NewTokens<T> new_tokens_of(const PagedKv& kv) {
  // The split kernels only read the cache; the append is the decode's one write to it.
  NewTokens<T> t;
  t.k_cache = static_cast<T*>(const_cast<void*>(kv.k_cache));
  t.v_cache = static_cast<T*>(const_cast<void*>(kv.v_cache));
  if (const DecodeAppend* a = kv.append) {
    t.k = static_cast<const T*>(a->k.data), t.v = static_cast<const T*>(a->v.data);
    t.k_stride = a->k.stride, t.v_stride = a->v.stride;
    t.positions = a->positions, t.slots = a->slots, t.rope_table = a->rope_table;
  }
  return t;
}

}  // namespace gpulab::kernels
