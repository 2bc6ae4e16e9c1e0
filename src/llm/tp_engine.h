// Tensor-parallel inference over the GPUs of one process: one CudaEngine per GPU, each holding
// its shard of the weights (llm/tensor_parallel.h) and driven by a thread of its own, joined by
// an NCCL communicator. The scheduler sees one Engine; every call runs on all ranks, in the same
// order, and rank 0's logits come back.
//
// Across processes or nodes, each process builds its CudaEngine itself with EngineOptions'
// shard and a communicator from ncclCommInitRank on a bootstrapped ncclUniqueId.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "llm/cuda_engine.h"
#include "llm/engine.h"

namespace gpulab::llm {

class TpEngine final : public Engine {
 public:
  // Rank r runs on CUDA device devices[r]; options apply to every rank (its memory fraction
  // to each GPU; shard and comm are set here). Throws core::NoDeviceError without a GPU,
  // core::InputError for a device list the visible GPUs do not hold or a model that does not
  // split devices.size() ways.
  TpEngine(const WeightSource& weights, const EngineOptions& options, std::vector<int> devices);
  ~TpEngine() override;

  const LlamaConfig& config() const override;
  const char* device_name() const override { return "cuda"; }
  int world() const;
  int64_t max_batch() const override;
  int64_t kv_capacity_tokens() const override;
  int64_t kv_free_tokens() const override;
  int64_t max_sequence_tokens() const override;
  std::optional<SeqId> open(int64_t max_tokens) override;
  void close(SeqId seq) override;
  void step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
            std::span<float> logits) override;

  // Logits [ids.size(), vocab] of every position of one prompt (CudaEngine::logits on all ranks).
  std::vector<float> logits(std::span<const int32_t> ids);
  CudaEngine::Capacity capacity() const;  // rank 0's (every rank has the same KV pool)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The devices 0 .. tp-1, checked against the visible GPUs: InputError naming both counts when
// there are fewer (core::NoDeviceError when there is none).
std::vector<int> tp_devices(int tp);

}  // namespace gpulab::llm
