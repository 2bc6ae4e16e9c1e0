#include "llm/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "llm/cpu_model.h"

namespace gpulab::llm {

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature))
    throw core::InputError("temperature must be a finite number >= 0");
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) throw core::InputError("top_p must be in (0, 1]");
  if (p.top_k < 0) throw core::InputError("top_k must be >= 0");
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { validate(params); }

int32_t Sampler::sample(std::span<const float> logits, SamplingScratch& scratch) {
  const int32_t best = argmax(logits);
  if (greedy()) return best;
  // Weights exp((logit - top) / T) of the candidates: the top-k (all without top_k), cut to the
  // smallest prefix in descending order whose weight reaches top_p of their total. Only what the
  // cuts need is sorted: a 32k vocabulary sorted whole took ~3 ms a token.
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::vector<int32_t>& order = scratch.order;
  order.resize(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k = params_.top_k > 0 ? std::min<size_t>(params_.top_k, order.size()) : order.size();
  if (k < order.size()) std::nth_element(order.begin(), order.begin() + k, order.end(), before);
  order.resize(k);
  std::vector<float>& weight = scratch.weight;
  weight.resize(logits.size());
  const float top = logits[size_t(best)], temperature = params_.temperature;
  double total = 0;
  for (int32_t i : order) total += weight[i] = std::exp((logits[i] - top) / temperature);
  size_t keep = k;  // candidates kept: the first `keep` of `order`
  if (params_.top_p < 1.f) {
    // Sort a prefix large enough to reach top_p, growing it until it does.
    double cumulative = 0;
    size_t sorted = 0;
    for (size_t want = std::min<size_t>(k, 256);; want = std::min(k, want * 8)) {
      std::nth_element(order.begin() + sorted, order.begin() + want - 1, order.end(), before);
      std::sort(order.begin() + sorted, order.begin() + want, before);
      for (; sorted < want; ++sorted) {
        cumulative += weight[order[sorted]] / total;
        if (cumulative >= params_.top_p) break;
      }
      if (sorted < want) {
        keep = sorted + 1;
        break;
      }
      if (want == k) break;  // rounding left the whole set short of top_p: keep it all
    }
  } else if (k < logits.size()) {
    std::sort(order.begin(), order.end(), before);  // top-k alone: draw in descending order
  }
  // Without cuts the draw walks the vocabulary in index order: the same distribution, no sort.
  double kept_total = 0;
  for (size_t i = 0; i < keep; ++i) kept_total += weight[order[i]];
  double u = std::uniform_real_distribution<double>(0.0, kept_total)(rng_);
  for (size_t i = 0; i < keep; ++i) {
    u -= weight[order[i]];
    if (u < 0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace gpulab::llm
