// Tensor parallelism for LLaMA-family models, Megatron style: what part of each weight a rank
// holds. The one place that says so, for the CPU check of the sharded math and the CUDA engine.
//
//   q/k/v, gate/up   column-parallel: a rank holds num_heads/N query heads, its KV heads and
//                    intermediate/N rows, so attention and SwiGLU run on local data
//   o, down          row-parallel: a rank holds the matching columns and produces a partial sum
//                    of the residual update; one all-reduce (sum) each completes it
//   lm_head          vocab-parallel: a rank computes the logits of its vocab rows, then they
//                    are gathered
//   embedding        replicated: every rank looks up whole rows (no masked lookup and no extra
//                    all-reduce per step; it costs vocab · hidden per rank)
//   norms, o bias    replicated; the o bias is added by rank 0 only, before the all-reduce
// KV heads split N ways when the model has at least N; with fewer (GQA), each rank holds the one
// KV head its query heads read, so a KV head is replicated on N / num_kv_heads ranks.
#pragma once

#include <cstdint>
#include <string>

#include "llm/config.h"
#include "llm/weights.h"

namespace gpulab::llm {

struct ShardSpec {
  int rank = 0;
  int world = 1;
};

// One rank's part of a model.
struct ShardLayout {
  ShardSpec shard;
  int64_t head_dim = 0;
  int64_t q_head_begin = 0, num_heads = 0;      // query heads
  int64_t kv_head_begin = 0, num_kv_heads = 0;  // KV heads
  int64_t inter_begin = 0, intermediate = 0;    // MLP rows
  // lm_head rows: every rank computes vocab_rows = ceil(vocab / world) logits, of which the
  // first vocab_count are token ids vocab_begin.. (the last rank's tail is padding).
  int64_t vocab_begin = 0, vocab_count = 0, vocab_rows = 0;
};

// Throws core::InputError when the model does not split `world` ways (heads, KV heads or the
// intermediate size not divisible, a vocabulary too small), naming the numbers.
ShardLayout shard_layout(const LlamaConfig& config, ShardSpec shard);

// The config one rank computes with: its heads, KV heads and intermediate size; hidden size and
// vocabulary whole (the embedding is replicated; lm_head rows come from the layout).
LlamaConfig shard_config(const LlamaConfig& config, const ShardLayout& layout);

// The part of Hugging Face tensor `name` (as weight_specs names it) that the rank holds.
TensorSlice shard_slice(const ShardLayout& layout, const std::string& name);

}  // namespace gpulab::llm
