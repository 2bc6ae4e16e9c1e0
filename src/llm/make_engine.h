// Picks and builds the engine a command asked for (--device cpu|cuda).
#pragma once

#include <memory>
#include <string>

#include "llm/cuda_engine.h"
#include "llm/engine.h"

namespace gpulab::llm {

struct EngineSpec {
  std::string device = "cpu";     // "cpu" or "cuda"
  int64_t cpu_kv_tokens = 16384;  // the CPU engine's KV room
  int threads = 0;                // CPU threads, 0: all
  EngineOptions cuda;             // the CUDA engine's sizing
  int tp = 1;                     // cuda: tensor parallel over GPUs 0 .. tp-1 (TpEngine)
};

// Throws core::InputError for an unknown device, a --tp above 1 on the CPU or above the visible
// GPU count, core::NoDeviceError for cuda without a GPU.
std::unique_ptr<Engine> make_engine(const WeightSource& weights, const EngineSpec& spec);

}  // namespace gpulab::llm
