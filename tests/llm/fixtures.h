// The transformers fixtures in tests/data/llama_tiny*: prompts, ids, greedy tokens, logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/safetensors.h"
#include "llm/config.h"

namespace gpulab::llm::testing {

struct FixtureCase {
  std::vector<int32_t> ids;
  std::vector<int32_t> greedy;
  std::vector<float> logits;       // [ids.size(), vocab], float32 forward of the bf16 weights
  std::vector<float> logits_bf16;  // the same, transformers' own forward in bf16
};

inline std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(GPULAB_TEST_DATA) / name;
}

// The largest |got - want| and the largest |want| (tolerances are fractions of the latter).
inline std::pair<float, float> max_abs_error(const std::vector<float>& got, const std::vector<float>& want) {
  float err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return {err, ref};
}

// A tensor of `dtype` (T's type) copied out of `tensors`; throws when it is missing or of another type.
template <class T>
std::vector<T> load_tensor(const core::SafetensorsFile& tensors, const std::string& name, core::DType dtype) {
  const core::TensorInfo* info = tensors.find(name);
  if (!info || info->dtype != dtype) throw std::runtime_error("fixture tensor " + name + " missing");
  const auto bytes = tensors.data(*info);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

inline std::vector<float> load_f32(const core::SafetensorsFile& tensors, const std::string& name) {
  return load_tensor<float>(tensors, name, core::DType::f32);
}

inline std::vector<FixtureCase> load_fixture_cases(const std::string& name) {
  const auto dir = fixture_dir(name);
  std::ifstream in(dir / "expected.json");
  const auto doc = nlohmann::json::parse(in);
  const core::SafetensorsFile tensors(dir / "expected.safetensors");
  std::vector<FixtureCase> cases;
  for (const auto& c : doc["cases"]) {
    FixtureCase fc;
    fc.ids = c["ids"].get<std::vector<int32_t>>();
    fc.greedy = c["greedy_fp32"].get<std::vector<int32_t>>();
    const std::string name = c["logits"].get<std::string>();  // "logits_i"; bf16: "logits_bf16_i"
    fc.logits = load_f32(tensors, name);
    fc.logits_bf16 = load_f32(tensors, "logits_bf16_" + name.substr(name.find('_') + 1));
    cases.push_back(std::move(fc));
  }
  return cases;
}

// llama_tiny's config made a GQA model that exercises tensor parallelism: 8 heads over 2 KV
// heads (replicated at TP 4 and 8), biases on q/k/v and o, tied embeddings, and a vocabulary of
// 1003 that no TP size above 1 splits evenly.
inline LlamaConfig gqa_test_config() {
  LlamaConfig c = read_model_config(fixture_dir("llama_tiny"));
  c.hidden_size = 256;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.intermediate_size = 512;
  c.vocab_size = 1003;
  c.qkv_bias = true;
  c.o_bias = true;
  c.tie_word_embeddings = true;
  return c;
}

// Writes llama_tiny's weights to `path` with every tensor converted to `dt` (fp32 or fp16).
inline void write_converted_weights(const std::filesystem::path& path, core::DType dt) {
  const core::SafetensorsFile orig(fixture_dir("llama_tiny") / "model.safetensors");
  std::vector<std::vector<uint8_t>> storage;
  std::vector<core::TensorToWrite> out;
  for (const auto& t : orig.tensors()) {
    const auto src = orig.data(t);
    std::vector<uint8_t> bytes(t.numel() * core::dtype_size(dt));
    for (uint64_t i = 0; i < t.numel(); ++i) {
      const float v = static_cast<float>(core::load_as_double(src.data(), t.dtype, i));
      if (dt == core::DType::f32) {
        std::memcpy(bytes.data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = core::float_to_f16_bits(v);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    storage.push_back(std::move(bytes));
    out.push_back({t.name, dt, t.shape, storage.back()});
  }
  core::write_safetensors(path, out);
}

}  // namespace gpulab::llm::testing
