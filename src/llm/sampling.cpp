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

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature == 0.f || params_.top_k == 1) return argmax(logits);
  // Candidates sorted by logit, cut to top-k, then softmax at the temperature, then the
  // smallest prefix whose probability reaches top_p.
  std::vector<int32_t>& order = order_;
  order.resize(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k = params_.top_k > 0 ? std::min<size_t>(params_.top_k, order.size()) : order.size();
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  order.resize(k);
  std::vector<double>& prob = prob_;
  prob.resize(k);
  const double top = logits[order[0]];
  double total = 0;
  for (size_t i = 0; i < k; ++i) total += prob[i] = std::exp((logits[order[i]] - top) / params_.temperature);
  size_t keep = k;
  if (params_.top_p < 1.f) {
    double cumulative = 0;
    for (size_t i = 0; i < k; ++i) {
      cumulative += prob[i] / total;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double kept_total = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  double u = std::uniform_real_distribution<double>(0.0, kept_total)(rng_);
  for (size_t i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u < 0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace gpulab::llm
