// The transformers fixtures in tests/data/llama_tiny*: prompts, ids, greedy tokens, logits.
#pragma once

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/safetensors.h"

namespace gpulab::llm::testing {

struct FixtureCase {
  std::vector<int32_t> ids;
  std::vector<int32_t> greedy;
  std::vector<float> logits;  // [ids.size(), vocab], float32 forward of the bf16 weights
};

inline std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(GPULAB_TEST_DATA) / name;
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
    const core::TensorInfo* info = tensors.find(c["logits"].get<std::string>());
    if (!info || info->dtype != core::DType::f32) throw std::runtime_error("fixture logits missing");
    const auto bytes = tensors.data(*info);
    fc.logits.resize(bytes.size() / sizeof(float));
    std::memcpy(fc.logits.data(), bytes.data(), bytes.size());
    cases.push_back(std::move(fc));
  }
  return cases;
}

}  // namespace gpulab::llm::testing
