// Token sampling: argmax against std::max_element, the cut-aware sampler against the plain
// algorithm it replaces (full sort, then top-k, softmax, top-p), and its distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "llm/cpu_model.h"
#include "llm/sampling.h"

namespace gpulab::llm {
namespace {

std::vector<float> random_logits(size_t n, uint64_t seed, float scale = 4.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(TokenSampling, ArgmaxIsTheFirstLargest) {
  for (size_t n : {1, 7, 8, 9, 1000, 32000, 128256}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      std::vector<float> v = random_logits(n, seed);
      EXPECT_EQ(argmax(v), std::max_element(v.begin(), v.end()) - v.begin()) << n;
      v[n / 3] = v[n - 1] = 100.f;  // a tie: the first index wins
      EXPECT_EQ(argmax(v), int32_t(n == 1 ? 0 : n / 3)) << n;
    }
  }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(argmax(std::vector<float>{-inf, -inf, -inf}), 0);
  EXPECT_EQ(argmax(std::vector<float>{nan, 1.f, 3.f, nan, 2.f}), 2);  // NaNs are skipped
  EXPECT_EQ(argmax(std::vector<float>{nan, nan}), 0);
  EXPECT_EQ(argmax(std::vector<float>{}), 0);
}

// The algorithm Sampler replaced: sort every candidate by logit (ties by index), keep the top-k,
// weight by exp((logit - top) / T) in float, keep the smallest prefix reaching top_p, draw in that order.
int32_t sample_by_full_sort(const std::vector<float>& logits, const SamplingParams& p, std::mt19937_64& rng) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  if (p.top_k > 0) order.resize(std::min<size_t>(p.top_k, order.size()));
  std::vector<float> w;
  double total = 0;
  for (int32_t i : order) total += w.emplace_back(std::exp((logits[i] - logits[order[0]]) / p.temperature));
  size_t keep = order.size();
  double cumulative = 0;
  for (size_t i = 0; i < order.size() && p.top_p < 1.f; ++i)
    if ((cumulative += w[i] / total) >= p.top_p) {
      keep = i + 1;
      break;
    }
  const double kept = std::accumulate(w.begin(), w.begin() + keep, 0.0);
  double u = std::uniform_real_distribution<double>(0.0, kept)(rng);
  for (size_t i = 0; i < keep; ++i)
    if ((u -= w[i]) < 0) return order[i];
  return order[keep - 1];
}

TEST(TokenSampling, CutsDrawWhatAFullSortDraws) {
  // top_p prefixes from a few tokens to past the first growth step (256), and top-k alone.
  const std::vector<SamplingParams> cases = {
      {1.0f, 0, 0.9f, 1}, {0.7f, 0, 0.5f, 2}, {1.5f, 0, 0.99f, 3}, {3.0f, 0, 0.95f, 4},
      {1.0f, 40, 0.9f, 5}, {1.0f, 40, 1.0f, 6}, {0.8f, 1000, 0.97f, 7}, {2.0f, 5, 1.0f, 8}};
  for (size_t c = 0; c < cases.size(); ++c) {
    const SamplingParams& p = cases[c];
    const std::vector<float> logits = random_logits(32000, 100 + c, 2.f);
    Sampler sampler(p);
    SamplingScratch scratch;
    std::mt19937_64 rng(p.seed);
    for (int t = 0; t < 40; ++t) ASSERT_EQ(sampler.sample(logits, scratch), sample_by_full_sort(logits, p, rng)) << c << ", draw " << t;
  }
}

TEST(TokenSampling, WithoutCutsTheDrawFollowsTheSoftmax) {
  const std::vector<float> logits = {0.f, 1.f, 2.f, -1.f, 0.5f, 2.f, -3.f};
  const float temperature = 0.8f;
  Sampler sampler({temperature, 0, 1.f, 7});
  SamplingScratch scratch;
  constexpr int kDraws = 200000;
  std::vector<int> count(logits.size());
  for (int i = 0; i < kDraws; ++i) ++count[size_t(sampler.sample(logits, scratch))];
  double total = 0;
  for (float l : logits) total += std::exp(l / temperature);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = std::exp(logits[i] / temperature) / total;
    const double sd = std::sqrt(kDraws * p * (1 - p));
    EXPECT_NEAR(count[i], kDraws * p, 5 * sd + 1) << "token " << i;
  }
}

TEST(TokenSampling, NucleusAndTopKNeverDrawOutside) {
  const std::vector<float> logits = random_logits(5000, 9, 3.f);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  Sampler top_k({1.0f, 3, 1.f, 1});
  Sampler greedy_k({0.5f, 1, 1.f, 1});
  SamplingScratch scratch;
  for (int i = 0; i < 2000; ++i) {
    const int32_t t = top_k.sample(logits, scratch);
    EXPECT_TRUE(t == order[0] || t == order[1] || t == order[2]) << t;
    EXPECT_EQ(greedy_k.sample(logits, scratch), order[0]);
  }
  // A distribution with one dominant token: top_p 0.5 keeps it alone.
  std::vector<float> peaked(1000, 0.f);
  peaked[123] = 20.f;
  Sampler nucleus({1.0f, 0, 0.5f, 3});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(nucleus.sample(peaked, scratch), 123);
}

// The scratch carries nothing between calls: samplers taking turns on one scratch, poisoned
// between draws and sized for another vocabulary, draw what each draws on a scratch of its own.
TEST(TokenSampling, SharedScratchDrawsWhatOwnScratchDraws) {
  const std::vector<SamplingParams> params = {{1.0f, 0, 0.9f, 11}, {0.7f, 40, 1.0f, 12}, {1.3f, 0, 1.0f, 13}, {0.9f, 100, 0.8f, 14}};
  const std::vector<float> logits = random_logits(6000, 21, 2.f);
  std::vector<Sampler> shared, own;
  for (const auto& p : params) {
    shared.emplace_back(p);
    own.emplace_back(p);
  }
  std::vector<SamplingScratch> own_scratch(params.size());
  SamplingScratch scratch;
  std::mt19937_64 poison(5);
  for (int t = 0; t < 30; ++t)
    for (size_t i = 0; i < params.size(); ++i) {
      scratch.order.assign(poison() % 9000, int32_t(poison() % 6000));
      scratch.weight.assign(poison() % 9000, std::nanf(""));
      ASSERT_EQ(shared[i].sample(logits, scratch), own[i].sample(logits, own_scratch[i])) << "sampler " << i << ", draw " << t;
    }
}

}  // namespace
}  // namespace gpulab::llm
