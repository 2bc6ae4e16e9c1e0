// Attention for LLaMA-family inference over a paged KV cache, GQA-aware (query head h reads kv
// head h / group):
//   attention_prefill  a chunk of queries per sequence, causal over everything cached before it
//                      and within it (flash attention on tensor cores for bf16/fp16 at head_dim
//                      64 and 128, scalar fp32 tiles otherwise; online softmax)
//   attention_decode   one new query per sequence (split-K over pages; GQA on tensor cores)
//   kv_cache_write     scatter new keys/values into their cache slots
// The paged cache of one layer holds K and V as [num_blocks, block_size, kv_heads, head_dim];
// sequence s owns blocks block_table[s, 0..], so position p lives in slot
// block_table[s, p / block_size] · block_size + p % block_size, below 2^31 (the engine's slots
// are int32 too).
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

// The new token of each decode row, for a decode that applies rope and stores it in the cache
// itself, in place of rope() with a RopeCacheWrite over those rows (the same bits): row s of
// q is not rotated yet; sequence s's new key (row s of k, not rotated) and value (row s of v)
// are rotated at positions[s], stored at cache slot slots[s] (negative: nowhere), and taken as
// its newest position by the decode.
struct DecodeAppend {
  ConstRows k;
  ConstRows v;
  const int32_t* positions;
  const int32_t* slots;
  const float2* rope_table;  // rope_table's angles, as rope() takes them
};

struct PagedKv {
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_table;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq;
  int64_t block_size;
  // Decode only. Set where each sequence's positions but its newest were cached, and the block
  // table, the lengths and the append's positions and slots copied, before the stream's run of
  // overlapped kernels that leads to the decode began (an earlier forward pass; a copy, then this
  // pass's kernels): the split kernels then request those rows and the new token's rope angles
  // before pdl_wait, while the kernels ahead still run, and the newest row and q after it.
  bool settled = false;
  const DecodeAppend* append = nullptr;  // decode only; the cache is then written at its slots
};

// Sequence s has query rows cu_q[s] .. cu_q[s+1] (device array of num_seqs + 1 ints) at
// positions kv_lens[s] - q_len .. kv_lens[s] - 1, whose keys and values are already in the
// cache; each query attends to positions 0 .. its own. max_q_len bounds every q_len.
void attention_prefill(Rows out, ConstRows q, const PagedKv& kv, const int32_t* cu_q, const int32_t* kv_lens,
                       int64_t num_seqs, int64_t max_q_len, const AttentionShape& shape, core::DType dtype,
                       cudaStream_t stream);

// attention_prefill runs on tensor cores (flash attention on mma.sync, fp32 accumulate, P
// rounded to the activation type before P·V) for bf16/fp16 with head_dim 64 or 128 when q and
// the cache are 16-byte aligned (pointers and row strides) and out 4-byte aligned; otherwise on
// scalar fp32 tiles. The scalar path alone is exposed so that tests and timings can compare.
bool attention_prefill_uses_tensor_cores(Rows out, ConstRows q, const PagedKv& kv, const AttentionShape& shape,
                                         core::DType dtype);
void attention_prefill_scalar(Rows out, ConstRows q, const PagedKv& kv, const int32_t* cu_q, const int32_t* kv_lens,
                              int64_t num_seqs, int64_t max_q_len, const AttentionShape& shape, core::DType dtype,
                              cudaStream_t stream);

// Row s of q attends to positions 0 .. seq_lens[s]-1 of sequence s (its own key already
// written). max_seq_len bounds every seq_lens[s]; the workspace (device, bytes from
// attention_decode_workspace) holds the partial results of the splits.
size_t attention_decode_workspace(int64_t num_seqs, int64_t max_seq_len, const AttentionShape& shape);
void attention_decode(Rows out, ConstRows q, const PagedKv& kv, const int32_t* seq_lens, int64_t num_seqs,
                      int64_t max_seq_len, const AttentionShape& shape, void* workspace, core::DType dtype,
                      cudaStream_t stream);

// attention_decode with its output quantized to e4m3 with a scale per row, as fp8_quantize's row
// granularity quantizes the dtype rows attention_decode writes (bit for bit): out [num_seqs,
// q_heads · head_dim] bytes, scales [num_seqs] floats. The input of a W8A8 o_proj.
void attention_decode_fp8(void* out, float* scales, ConstRows q, const PagedKv& kv, const int32_t* seq_lens,
                          int64_t num_seqs, int64_t max_seq_len, const AttentionShape& shape, void* workspace,
                          core::DType dtype, cudaStream_t stream);

// attention_decode scores and weighs on tensor cores (mma.sync; P rounded to the activation type
// before P·V) where 2 to 16 query heads share a kv head, for bf16/fp16 at head_dim 64 or 128 with
// q and the cache 16-byte aligned; otherwise (and for one head per kv head, where CUDA cores keep
// up with HBM) in fp32 on CUDA cores. Both paths are exposed so that tests and timings can
// compare; the tensor-core one throws where it does not apply.
bool attention_decode_uses_tensor_cores(ConstRows q, const PagedKv& kv, const AttentionShape& shape,
                                        core::DType dtype);
void attention_decode_cuda_cores(Rows out, ConstRows q, const PagedKv& kv, const int32_t* seq_lens, int64_t num_seqs,
                                 int64_t max_seq_len, const AttentionShape& shape, void* workspace, core::DType dtype,
                                 cudaStream_t stream);
void attention_decode_tensor_cores(Rows out, ConstRows q, const PagedKv& kv, const int32_t* seq_lens,
                                   int64_t num_seqs, int64_t max_seq_len, const AttentionShape& shape, void* workspace,
                                   core::DType dtype, cudaStream_t stream);

// k/v rows of `tokens` tokens ([kv_heads · head_dim] each) go to slots[t] (negative: skipped).
void kv_cache_write(void* k_cache, void* v_cache, ConstRows k, ConstRows v, const int32_t* slots, int64_t tokens,
                    int64_t kv_heads, int64_t head_dim, core::DType dtype, cudaStream_t stream);

// CPU reference: `tokens` queries at positions past .. past+tokens-1 over keys/values
// 0 .. past+tokens-1 (contiguous rows), causal. Threads over (token, head).
void attention_ref(float* out, int64_t out_stride, const float* q, int64_t q_stride, const float* k,
                   const float* v, int64_t kv_stride, int64_t tokens, int64_t past, const AttentionShape& shape,
                   int threads = 1);

}  // namespace gpulab::kernels
