// The CUDA inference engine for LLaMA-family models: bf16 weights uploaded once (q/k/v and
// gate/up fused at load), float32 residual stream and accumulation, cuBLASLt GEMMs, a paged KV
// cache sized from free memory, batched prefill and decode with continuous batching, and CUDA
// graphs for decode steps. Every buffer is sized up front; a request that cannot fit is
// refused with an InputError before any work starts.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "llm/config.h"
#include "llm/weights.h"

namespace gpulab::llm {

struct EngineOptions {
  double gpu_memory_fraction = 0.9;  // of the GPU's total memory, for weights + buffers + KV cache
  int64_t max_batch = 64;            // sequences decoded together
  int64_t max_seq_len = 0;           // prompt + generated tokens; 0: min(max_position_embeddings, 8192)
  int64_t max_kv_tokens = 0;         // cap on the KV pool; 0: as much as memory allows
  int64_t block_size = 16;           // tokens per KV page
  bool cuda_graphs = true;           // replay decode steps from CUDA graphs
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 0;
  bool stop_at_eos = false;
};

class CudaEngine {
 public:
  // Throws core::NoDeviceError without a GPU, core::InputError when the model or its buffers
  // do not fit in gpu_memory_fraction of the GPU.
  CudaEngine(const WeightSource& weights, const EngineOptions& options = {});
  ~CudaEngine();
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const LlamaConfig& config() const;

  // Logits [ids.size(), vocab] in float32 for one prompt.
  std::vector<float> logits(std::span<const int32_t> ids);

  // Greedy continuations of every request, batched continuously: a request starts as soon as
  // a batch slot and its KV pages are free. Returns the generated tokens of each request.
  std::vector<std::vector<int32_t>> generate_greedy(const std::vector<GenerationRequest>& requests);

  struct Capacity {
    int64_t kv_blocks = 0;
    int64_t block_size = 0;
    int64_t max_batch = 0;
    int64_t max_seq_len = 0;
    size_t weight_bytes = 0;
    size_t buffer_bytes = 0;
    size_t kv_bytes = 0;
  };
  Capacity capacity() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpulab::llm
