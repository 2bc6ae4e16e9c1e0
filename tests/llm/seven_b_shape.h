// LLaMA-2-7B's shape for the GPU tests that build it from random weights.
#pragma once

#include <cstdint>

#include "common/gpu.h"
#include "llm/config.h"

namespace gpulab::llm::testing {

// Under racecheck `racecheck_layers` of its 32 layers: racecheck checks each launch's shared-memory
// accesses, and every layer launches the same kernels at the same shapes, so the other layers only
// take time; with all 32 the tensor-parallel test outlasted its call (273 s, session 42;
// docs/reliability.md). Elsewhere all 32.
inline LlamaConfig seven_b_shape(int64_t racecheck_layers) {
  LlamaConfig config = builtin_config("llama2-7b");
  if (under_racecheck()) config.num_layers = racecheck_layers;
  return config;
}

}  // namespace gpulab::llm::testing
