// A random LLaMA-2-7B-shape checkpoint and transformers' logits for it, for the tests that hold
// the CPU reference (test_cpu_model.cpp) and the CUDA engine (test_cuda_engine_gpu.cpp) to
// transformers at that shape. They skip unless GPULAB_HF_REFERENCE_DIR is set.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "core/safetensors.h"
#include "llm/fixtures.h"

namespace gpulab::llm::testing {

// A random LLaMA-2-7B-shape checkpoint that transformers wrote, with the logits transformers
// computes in float64 and its own bf16 forward's, made on the GPU machine by
// tests/reference/hf_llama_random.py (GPULAB_HF_REFERENCE_DIR names it; its docstring says why
// the init std is 0.01).
struct HfReference {
  std::vector<int32_t> ids;
  std::vector<float> logits, logits_fp32, logits_bf16;  // transformers in float64, float32, bf16
  std::vector<float> logits_bf16_rope;  // float64 with bf16-rounded RoPE frequencies, as the engines
};

// Reads it; nullopt when GPULAB_HF_REFERENCE_DIR is not set.
inline std::optional<HfReference> hf_reference() {
  const char* dir = std::getenv("GPULAB_HF_REFERENCE_DIR");
  if (!dir) return std::nullopt;
  const core::SafetensorsFile file(std::filesystem::path(dir) / "reference.safetensors");
  HfReference ref;
  ref.ids = load_tensor<int32_t>(file, "ids", core::DType::i32);
  ref.logits = load_f32(file, "logits");
  ref.logits_fp32 = load_f32(file, "logits_fp32");
  ref.logits_bf16_rope = load_f32(file, "logits_bf16_rope");
  ref.logits_bf16 = load_f32(file, "logits_bf16");
  return ref;
}

}  // namespace gpulab::llm::testing
