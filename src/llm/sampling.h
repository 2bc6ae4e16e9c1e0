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

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  // Scratch reused across tokens (vocabulary-sized): candidate ids, and weights by token id.
  std::vector<int32_t> order_;
  std::vector<float> weight_;
};

}  // namespace gpulab::llm
