// Attention for LLaMA-family inference, GQA-aware (query head h reads kv head h / group):
//   attention_prefill  causal self-attention of packed sequences (tiled, online softmax)
//   attention_decode   one new query per sequence over its paged KV cache (split-K over pages)
//   kv_cache_write     scatter new keys/values into their cache slots
// The paged cache of one layer holds K and V as [num_blocks, block_size, kv_heads, head_dim];
// sequence s owns blocks block_table[s, 0..], so position p lives in slot
// block_table[s, p / block_size] · block_size + p % block_size.
// Supported head_dim: 32, 64, 128, 256.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace gpulab::kernels {

struct AttentionShape {
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.f;  // usually 1 / sqrt(head_dim)
};

// A strided matrix of rows (a q, k or v slice of a fused QKV buffer, or the output).
struct Rows {
  void* data;
  int64_t stride;  // elements between rows
};
struct ConstRows {
  const void* data;
  int64_t stride;
};

// Sequence s is rows cu_seqlens[s] .. cu_seqlens[s+1] of q, k, v and out (device array of
// num_seqs + 1 ints); it attends causally to itself only. max_seqlen bounds every length.
void attention_prefill(Rows out, ConstRows q, ConstRows k, ConstRows v, const int32_t* cu_seqlens, int64_t num_seqs,
                       int64_t max_seqlen, const AttentionShape& shape, core::DType dtype, cudaStream_t stream);

struct PagedKv {
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_table;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq;
  int64_t block_size;
};

// Row s of q attends to positions 0 .. seq_lens[s]-1 of sequence s (its own key already
// written). max_seq_len bounds every seq_lens[s]; the workspace (device, bytes from
// attention_decode_workspace) holds the partial results of the splits.
size_t attention_decode_workspace(int64_t num_seqs, int64_t max_seq_len, const AttentionShape& shape);
void attention_decode(Rows out, ConstRows q, const PagedKv& kv, const int32_t* seq_lens, int64_t num_seqs,
                      int64_t max_seq_len, const AttentionShape& shape, void* workspace, core::DType dtype,
                      cudaStream_t stream);

// k/v rows of `tokens` tokens ([kv_heads · head_dim] each) go to slots[t] (negative: skipped).
void kv_cache_write(void* k_cache, void* v_cache, ConstRows k, ConstRows v, const int32_t* slots, int64_t tokens,
                    int64_t kv_heads, int64_t head_dim, core::DType dtype, cudaStream_t stream);

// CPU reference: `tokens` queries at positions past .. past+tokens-1 over keys/values
// 0 .. past+tokens-1 (contiguous rows), causal. Threads over (token, head).
void attention_ref(float* out, int64_t out_stride, const float* q, int64_t q_stride, const float* k,
                   const float* v, int64_t kv_stride, int64_t tokens, int64_t past, const AttentionShape& shape,
                   int threads = 1);

}  // namespace gpulab::kernels
