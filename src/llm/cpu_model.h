// The CPU reference forward of a LLaMA-family model: float32 throughout, written to be read,
// threaded over rows with std::thread. CI checks it against the transformers fixtures, and the
// CUDA engine is checked against it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "llm/config.h"
#include "llm/weights.h"

namespace gpulab::llm {

class CpuModel {
 public:
  // Converts every weight to float32 up front. `threads` 0: one per hardware thread.
  explicit CpuModel(const WeightSource& weights, int threads = 0);

  const LlamaConfig& config() const { return config_; }

  // Keys and values of the positions run so far, per layer [length, kv_dim] (after RoPE).
  struct KvCache {
    std::vector<std::vector<float>> k, v;
    int64_t length = 0;
  };
  KvCache new_cache() const;

  // Runs `ids` at positions cache.length.., appends their keys and values to `cache`, and
  // returns logits [ids.size(), vocab].
  std::vector<float> forward(std::span<const int32_t> ids, KvCache& cache) const;
  // Logits [T, vocab] of a prompt from an empty cache.
  std::vector<float> logits(std::span<const int32_t> ids) const;
  // Greedy continuation: `max_new` argmax tokens (stopping early at an eos id when asked).
  std::vector<int32_t> generate_greedy(std::span<const int32_t> prompt, int64_t max_new,
                                       bool stop_at_eos = false) const;

 private:
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, mlp_norm;
    std::vector<float> w_gate_up;  // gate rows then up rows [2 · intermediate, hidden]
    std::vector<float> w_down;
  };
  // out[T, n] = x[T, k] · w[n, k]ᵀ (+ bias[n] when given).
  void linear(const float* x, int64_t tokens, const std::vector<float>& w, const std::vector<float>& bias,
              int64_t n, int64_t k, float* out) const;

  LlamaConfig config_;
  int threads_;
  std::vector<float> embed_, final_norm_, lm_head_;  // lm_head_ empty when tied
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
};

// Index of the largest of `values` (the first one on ties; NaNs are skipped; 0 when empty or all NaN).
int32_t argmax(std::span<const float> values);

}  // namespace gpulab::llm
