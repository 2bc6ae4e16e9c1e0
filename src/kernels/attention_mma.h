// Internal to the attention op: its tensor-core kernels (mma.sync, fp32 accumulate), which
// attention.cu calls where attention_mma_operands_ok holds.
//   attention_prefill_mma         flash attention for prefill; the contract of attention_prefill
//   attention_decode_splits_mma   decode's split pass for GQA; attention.cu combines the partials
#pragma once

#include "kernels/attention.h"

namespace gpulab::kernels {

// bf16/fp16 at head_dim 64 or 128, with q and the cache 16-byte aligned (pointers and q's row
// stride): they travel in 16-byte cp.async copies.
bool attention_mma_operands_ok(ConstRows q, const PagedKv& kv, const AttentionShape& shape, core::DType dtype);

void attention_prefill_mma(Rows out, ConstRows q, const PagedKv& kv, const int32_t* cu_q, const int32_t* kv_lens,
                           int64_t num_seqs, int64_t max_q_len, const AttentionShape& shape, core::DType dtype,
                           cudaStream_t stream);

// Decode splits the positions of a sequence into runs of kDecodeSplit; block b of a (kv head,
// sequence) takes splits b, b + blocks, ... and writes, for each query head of the kv head, one
// partial output (unnormalized, [D] floats), its maximum score m (natural log units, scale applied)
// and its sum l of exp(score - m), at index (seq · q_heads + head) · blocks + b.
constexpr int kDecodeSplit = 64;
struct DecodePartials {
  float* o;
  float* m;
  float* l;
  int blocks;
};

// At most 16 query heads per kv head (one mma row tile).
void attention_decode_splits_mma(ConstRows q, const PagedKv& kv, const int32_t* seq_lens, int64_t num_seqs,
                                 const AttentionShape& shape, const DecodePartials& parts, core::DType dtype,
                                 cudaStream_t stream);

}  // namespace gpulab::kernels
