// How a bf16 engine's logits and greedy tokens are judged against float32: relative L2 and top-1
// agreement, and a bf16 forward may pick another token than float32 only where the two are nearly
// tied. Shared by the model and engine tests and the HTTP tests that run on a GPU engine.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "llm/cpu_model.h"

namespace gpulab::llm::testing {

inline int64_t top1(const float* row, int64_t vocab) { return std::max_element(row, row + vocab) - row; }

// The float32 margin by which `row`'s top token leads `token` (0 when `token` is the top).
inline float fp32_gap(const float* row, int64_t vocab, int64_t token) { return row[top1(row, vocab)] - row[token]; }

// How far `got` lies from `want` (each [rows, vocab]): relative L2 over all logits (infinite when
// `got` holds a non-finite value) and the rows whose top-1 tokens agree.
struct Agreement {
  double rel_l2;
  int64_t top1_agree, rows;
};

inline Agreement compare_logits(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  double num = 0, den = 0;
  const int64_t rows = static_cast<int64_t>(want.size()) / vocab;
  int64_t agree = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return {INFINITY, 0, rows};
    num += (got[i] - want[i]) * double(got[i] - want[i]);
    den += want[i] * double(want[i]);
  }
  for (int64_t r = 0; r < rows; ++r) agree += top1(got.data() + r * vocab, vocab) == top1(want.data() + r * vocab, vocab);
  return {std::sqrt(num / den), agree, rows};
}

// A near tie: the float32 logits of the two tokens lie within two bf16 steps (2^-6 relative) of
// each other. The largest margin transformers' own bf16 forward flips on the llama_tiny fixtures
// is 0.128 at 16.9 (2^-7.05).
inline bool near_tie(const float* row, int64_t vocab, int64_t token) {
  return fp32_gap(row, vocab, token) <= std::ldexp(std::abs(row[top1(row, vocab)]), -6);
}

// Every token of `generated` is float32's greedy choice given the tokens before it, or a near
// tie with it. The float32 logits come from the CPU reference over the prompt and the engine's
// own tokens, so one early flip does not fail every token after it. Flips are printed with
// their margins, so a near tie is told from a bug.
inline void expect_float32_greedy_or_near_tie(const CpuModel& cpu, std::span<const int32_t> prompt,
                                              std::span<const int32_t> generated, const std::string& label) {
  const int64_t vocab = cpu.config().vocab_size;
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), generated.begin(), generated.end());
  const std::vector<float> fp32 = cpu.logits(ids);
  for (size_t t = 0; t < generated.size(); ++t) {
    const float* row = fp32.data() + (prompt.size() - 1 + t) * vocab;
    const int32_t token = generated[t];
    const int64_t top = top1(row, vocab);
    if (token == top) continue;
    std::printf("%s token %zu: engine %d, float32 %lld (float32 logits %.4f vs %.4f, margin %.4f)\n", label.c_str(), t,
                token, static_cast<long long>(top), row[top], row[token], fp32_gap(row, vocab, token));
    EXPECT_TRUE(near_tie(row, vocab, token)) << label << " token " << t << ": not a near tie";
  }
}

}  // namespace gpulab::llm::testing
