// Choosing the next token from logits: greedy, or temperature with top-k and top-p (nucleus)
// filtering, reproducible from a seed.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace gpulab::llm {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy (argmax)
  int top_k = 0;            // 0: no limit
  float top_p = 1.f;        // 1: no nucleus cut
  uint64_t seed = 0;
};

// Throws core::InputError when a parameter is out of range (negative temperature, top_p ∉ (0,1]).
void validate(const SamplingParams& params);

// Vocabulary-sized work space of Sampler::sample (candidate ids, and weights by token id). It
// carries nothing from one call to the next: a server keeps one per sampling thread, reused by
// every request, rather than one per request (blocks of a vocabulary per request, 1 MB for
// 128k tokens, allocated on short-lived threads, scatter over malloc's arenas and grow the RSS).
struct SamplingScratch {
  std::vector<int32_t> order;
  std::vector<float> weight;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits, SamplingScratch& scratch);
  // Sampling is the argmax (temperature 0 or top_k 1): it draws nothing from the generator.
  bool greedy() const { return params_.temperature == 0.f || params_.top_k == 1; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace gpulab::llm
