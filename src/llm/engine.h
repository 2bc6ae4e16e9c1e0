// The interface the request scheduler drives: a model that advances many sequences at once,
// one step at a time. The CPU reference and the CUDA engine both implement it, so `generate`
// and `serve` run the same code on either device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "llm/config.h"
#include "llm/weights.h"

namespace gpulab::llm {

using SeqId = int64_t;

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const LlamaConfig& config() const = 0;
  virtual const char* device_name() const = 0;  // "cpu", "cuda"
  // The most sequences one step may carry.
  virtual int64_t max_batch() const = 0;
  // KV-cache room in tokens: a sequence reserves its worst-case length when opened.
  virtual int64_t kv_capacity_tokens() const = 0;  // the whole pool
  virtual int64_t kv_free_tokens() const = 0;
  // The longest one sequence may grow (prompt + generated): at most the pool, often less.
  virtual int64_t max_sequence_tokens() const = 0;

  // Reserves room for a sequence of up to `max_tokens` tokens (prompt + generated); nullopt
  // when that room is not free now.
  virtual std::optional<SeqId> open(int64_t max_tokens) = 0;
  virtual void close(SeqId seq) = 0;

  // One batched step: appends chunks[i] (a prompt chunk or the last sampled token) to sequence
  // seqs[i] and writes the logits of each chunk's last token to row i of `logits` [n, vocab].
  virtual void step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
                    std::span<float> logits) = 0;
  // The same step for a caller that wants only each chunk's greedy next token (the largest
  // logit, the first on ties) in tokens[i]. This default picks it on the host from step's
  // logits; the CUDA engine picks it on the GPU and copies back one id a row instead of a row
  // of the vocabulary (2 MB a step at batch 16 of a 32k vocabulary, then the host's argmax).
  virtual void step_greedy(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
                           std::span<int32_t> tokens);

 private:
  std::vector<float> greedy_logits_;  // step_greedy's logits, reused from step to step
};

// The float32 CPU reference as an engine (threaded per step; sequences run one after another).
// Call open/close/step from one thread (the scheduler's).
std::unique_ptr<Engine> make_cpu_engine(const WeightSource& weights, int64_t kv_capacity_tokens,
                                        int threads = 0);


}  // namespace gpulab::llm
