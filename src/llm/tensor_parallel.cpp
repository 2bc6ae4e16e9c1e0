#include "llm/tensor_parallel.h"

#include <algorithm>

#include "core/error.h"

namespace gpulab::llm {

namespace {

std::string split_error(ShardSpec s, int64_t value, const char* what) {
  return "tensor parallel " + std::to_string(s.world) + ": the model's " + std::to_string(value) + " " + what +
         " do not split " + std::to_string(s.world) + " ways (choose a --tp that divides it)";
}

}  // namespace

ShardLayout shard_layout(const LlamaConfig& c, ShardSpec s) {
  if (s.world < 1) throw core::InputError("tensor parallel size must be at least 1, not " + std::to_string(s.world));
  if (s.rank < 0 || s.rank >= s.world)
    throw core::Error("rank " + std::to_string(s.rank) + " outside a world of " + std::to_string(s.world));
  const int64_t n = s.world, heads = c.num_heads, kv = c.num_kv_heads;
  if (heads % n) throw core::InputError(split_error(s, heads, "attention heads"));
  if (kv >= n ? kv % n : n % kv)
    throw core::InputError("tensor parallel " + std::to_string(n) + ": the model's " + std::to_string(kv) +
                           " KV heads neither split " + std::to_string(n) + " ways nor divide " + std::to_string(n) +
                           " (choose a --tp that divides or is a multiple of it)");
  if (c.intermediate_size % n) throw core::InputError(split_error(s, c.intermediate_size, "MLP rows"));

  ShardLayout L;
  L.shard = s;
  L.head_dim = c.head_dim;
  L.num_heads = heads / n;
  L.q_head_begin = s.rank * L.num_heads;
  // Query head h reads KV head h / group; a rank's query heads all read KV heads of its own.
  L.kv_head_begin = L.q_head_begin / (heads / kv);
  L.num_kv_heads = std::max<int64_t>(kv / n, 1);
  L.intermediate = c.intermediate_size / n;
  L.inter_begin = s.rank * L.intermediate;
  L.vocab_rows = (c.vocab_size + n - 1) / n;
  L.vocab_begin = s.rank * L.vocab_rows;
  L.vocab_count = std::min(L.vocab_rows, c.vocab_size - L.vocab_begin);
  if ((n - 1) * L.vocab_rows >= c.vocab_size)
    throw core::InputError(split_error(s, c.vocab_size, "vocabulary rows"));
  return L;
}

LlamaConfig shard_config(const LlamaConfig& c, const ShardLayout& L) {
  LlamaConfig part = c;
  part.num_heads = L.num_heads;
  part.num_kv_heads = L.num_kv_heads;
  part.intermediate_size = L.intermediate;
  return part;
}

TensorSlice shard_slice(const ShardLayout& L, const std::string& name) {
  const int64_t d = L.head_dim;
  if (name == "lm_head.weight") return {0, L.vocab_begin, L.vocab_count};
  if (name == "model.embed_tokens.weight" || name.ends_with("norm.weight") || name.ends_with("o_proj.bias"))
    return {};
  if (name.ends_with("q_proj.weight") || name.ends_with("q_proj.bias")) return {0, L.q_head_begin * d, L.num_heads * d};
  if (name.ends_with("k_proj.weight") || name.ends_with("k_proj.bias") || name.ends_with("v_proj.weight") ||
      name.ends_with("v_proj.bias"))
    return {0, L.kv_head_begin * d, L.num_kv_heads * d};
  if (name.ends_with("o_proj.weight")) return {1, L.q_head_begin * d, L.num_heads * d};
  if (name.ends_with("gate_proj.weight") || name.ends_with("up_proj.weight")) return {0, L.inter_begin, L.intermediate};
  if (name.ends_with("down_proj.weight")) return {1, L.inter_begin, L.intermediate};
  throw core::Error("tensor parallel: no sharding rule for tensor '" + name + "'");
}

}  // namespace gpulab::llm
