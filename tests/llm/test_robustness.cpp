// Regression tests for config.json inputs the fuzzer (tests/fuzz/fuzz_config) found or aims at.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fixtures.h"
#include "llm/config.h"

using namespace gpulab;
using nlohmann::json;

namespace {

json tiny_config() {
  std::ifstream in(llm::testing::fixture_dir("llama_tiny") / "config.json");
  return json::parse(in);
}

std::string refusal(const std::string& text) {
  try {
    llm::parse_config(text, "config.json");
  } catch (const core::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// crash_number_beyond_double in the corpus: 1e99999 escaped json::parse as out_of_range.
TEST(ConfigRobustness, NumberBeyondDoubleIsMalformedJson) {
  EXPECT_NE(refusal(R"({"architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e99999})").find("malformed JSON"),
            std::string::npos);
}

TEST(ConfigRobustness, ImplausibleSizesAreRefusedBeforeTheyOverflow) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size", "head_dim",
                            "num_attention_heads", "max_position_embeddings"}) {
    json c = tiny_config();
    c[field] = int64_t{1} << 40;
    if (std::string(field) == "num_attention_heads") c["num_key_value_heads"] = int64_t{1} << 40;
    EXPECT_NE(refusal(c.dump()).find("implausibly large"), std::string::npos) << field << ": " << refusal(c.dump());
  }
  json c = tiny_config();
  c["hidden_size"] = int64_t{1} << 20;
  c["intermediate_size"] = int64_t{1} << 22;
  c["num_hidden_layers"] = int64_t{1} << 12;
  c["vocab_size"] = int64_t{1} << 24;
  const llm::LlamaConfig big = llm::parse_config(c.dump(), "config.json");  // the largest accepted
  EXPECT_GT(big.num_params(), int64_t{1} << 50);
}

TEST(ConfigRobustness, NonPositiveSlidingWindowIsRefused) {
  json c = tiny_config();
  c["architectures"] = {"MistralForCausalLM"};
  c["model_type"] = "mistral";
  c["sliding_window"] = 0;
  EXPECT_NE(refusal(c.dump()).find("sliding_window"), std::string::npos) << refusal(c.dump());
  c["sliding_window"] = 64;
  EXPECT_EQ(llm::parse_config(c.dump(), "config.json").max_position_embeddings, 64);
}
