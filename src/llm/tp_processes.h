// Tensor parallel across processes (one GPU each, on one node or several): rank 0 is the
// Engine the scheduler drives; it runs its own shard and sends every call to the other ranks over
// the group's NCCL communicator (a broadcast before each step), so they make the same calls in
// the same order. The communicator comes from the launcher's bootstrap (an ncclUniqueId shared
// by rank, world size and address): ncclCommInitRank on each process's GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "llm/cuda_engine.h"
#include "llm/engine.h"

namespace gpulab::llm {

// Rank 0. options.shard is {0, world} and options.comm its communicator; the followers build
// their engines at the same time (construction agrees on sizes over the communicator).
class LeaderEngine final : public Engine {
 public:
  LeaderEngine(const WeightSource& weights, const EngineOptions& options);
  ~LeaderEngine() override;  // tells the followers to stop

  const LlamaConfig& config() const override;
  const char* device_name() const override { return "cuda"; }
  int64_t max_batch() const override;
  int64_t kv_capacity_tokens() const override;
  int64_t kv_free_tokens() const override;
  int64_t max_sequence_tokens() const override;
  std::optional<SeqId> open(int64_t max_tokens) override;
  void close(SeqId seq) override;
  void step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
            std::span<float> logits) override;
  std::vector<float> logits(std::span<const int32_t> ids);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Ranks 1 .. world-1: builds this rank's CudaEngine and replays the leader's calls until the
// leader stops. A call that fails with a user error fails alike on the leader and is skipped.
void follow_leader(const WeightSource& weights, const EngineOptions& options);

// The calls as the leader sends them: the opens and closes since the last message, in order,
// then one step, one logits pass, or stop. Flattened to int64 for the broadcast.
struct TpMessage {
  enum class Kind : int64_t { step = 1, logits = 2, stop = 3 };
  struct Call {  // open(max_tokens) that gave the leader `seq` (a follower must get the same), or close(seq): max_tokens 0
    int64_t max_tokens = 0;
    SeqId seq = 0;
  };
  std::vector<Call> calls;
  Kind kind = Kind::stop;
  std::vector<SeqId> seqs;                    // step: one per chunk; logits: none
  std::vector<std::vector<int32_t>> chunks;  // step: the chunks; logits: the one prompt
};
std::vector<int64_t> encode(const TpMessage& message);
TpMessage decode(std::span<const int64_t> words);  // throws core::Error on a malformed message

}  // namespace gpulab::llm
