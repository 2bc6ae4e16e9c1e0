// config.json / generation_config.json parsing in both transformers styles, built-in shapes,
// RoPE scaling, and the errors for what is not supported.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>

#include "core/error.h"
#include "llm/config.h"
#include "llm/fixtures.h"
#include "llm/tokenizer.h"

namespace gpulab::llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json tiny_config_json() {
  std::ifstream in(testing::fixture_dir("llama_tiny") / "config.json");
  return json::parse(in);
}

// A transformers-4 style config of the same model.
json tiny_config_v4() {
  json j = tiny_config_json();
  j.erase("rope_parameters");
  j.erase("dtype");
  j["rope_theta"] = 10000.0;
  j["torch_dtype"] = "bfloat16";
  j["rope_scaling"] = nullptr;
  return j;
}

std::string expect_input_error(const json& j, const std::string& path = "/x/config.json") {
  try {
    parse_config(j.dump(), path);
  } catch (const core::InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError for " << j.dump();
  return "";
}

TEST(LlmConfig, ReadsTinyFixtureTransformers5) {
  const LlamaConfig c = read_model_config(testing::fixture_dir("llama_tiny"));
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.intermediate_size, 352);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope.type, RopeType::standard);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.dtype, core::DType::bf16);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
}

TEST(LlmConfig, Transformers4StyleGivesTheSameConfig) {
  json j = tiny_config_v4();
  j["rope_theta"] = 500000.0;
  j["torch_dtype"] = "float16";
  const LlamaConfig c = parse_config(j.dump(), "v4.json");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.type, RopeType::standard);
  EXPECT_EQ(c.dtype, core::DType::f16);
  EXPECT_EQ(c.num_kv_heads, 2);
}

TEST(LlmConfig, HeadDimAndKvHeadsDefault) {
  json j = tiny_config_v4();
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  const LlamaConfig c = parse_config(j.dump(), "c.json");
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_kv_heads, 4);
}

TEST(LlmConfig, RopeScalingBothStyles) {
  json v4 = tiny_config_v4();
  v4["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const LlamaConfig a = parse_config(v4.dump(), "a.json");
  EXPECT_EQ(a.rope.type, RopeType::llama3);
  EXPECT_DOUBLE_EQ(a.rope.factor, 8.0);
  EXPECT_EQ(a.rope.original_max_position_embeddings, 8192);

  json v5 = tiny_config_json();
  v5["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1234.0}};
  const LlamaConfig b = parse_config(v5.dump(), "b.json");
  EXPECT_EQ(b.rope.type, RopeType::linear);
  EXPECT_DOUBLE_EQ(b.rope.factor, 2.0);
  EXPECT_DOUBLE_EQ(b.rope.theta, 1234.0);

  json old = tiny_config_v4();
  old["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};  // before "rope_type" existed
  EXPECT_EQ(parse_config(old.dump(), "c.json").rope.type, RopeType::linear);
}

TEST(LlmConfig, MistralAndQwen2) {
  json m = tiny_config_v4();
  m["architectures"] = {"MistralForCausalLM"};
  m["sliding_window"] = 256;
  const LlamaConfig mc = parse_config(m.dump(), "m.json");
  EXPECT_EQ(mc.max_position_embeddings, 256);
  EXPECT_FALSE(mc.qkv_bias);

  json q = tiny_config_v4();
  q["architectures"] = {"Qwen2ForCausalLM"};
  q["tie_word_embeddings"] = true;
  q["sliding_window"] = 256;
  q["use_sliding_window"] = false;
  const LlamaConfig qc = parse_config(q.dump(), "q.json");
  EXPECT_TRUE(qc.qkv_bias);
  EXPECT_FALSE(qc.o_bias);
  EXPECT_TRUE(qc.tie_word_embeddings);
  EXPECT_EQ(qc.max_position_embeddings, 512);
  const auto specs = weight_specs(qc);
  auto has = [&](const std::string& n) {
    return std::ranges::any_of(specs, [&](const WeightSpec& s) { return s.name == n; });
  };
  EXPECT_TRUE(has("model.layers.1.self_attn.k_proj.bias"));
  EXPECT_FALSE(has("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_FALSE(has("lm_head.weight"));
}

TEST(LlmConfig, GenerationConfigEosList) {
  const fs::path dir = fs::temp_directory_path() / ("gpulab_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << tiny_config_json().dump();
  std::ofstream(dir / "generation_config.json") << R"({"bos_token_id": 7, "eos_token_id": [1, 9, 12]})";
  const LlamaConfig c = read_model_config(dir);
  EXPECT_EQ(c.bos_token_id, 7);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 9, 12}));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [1, "x"]})";
  try {
    read_model_config(dir);
    ADD_FAILURE() << "no error for a string eos id";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(LlmConfig, ErrorsNameFileAndProblem) {
  json j = tiny_config_json();
  j["rope_parameters"]["rope_type"] = "yarn";
  std::string msg = expect_input_error(j);
  EXPECT_NE(msg.find("/x/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unsupported rope type \"yarn\""), std::string::npos) << msg;

  j = tiny_config_json();
  j["architectures"] = {"GPT2LMHeadModel"};
  msg = expect_input_error(j);
  EXPECT_NE(msg.find("unsupported architecture \"GPT2LMHeadModel\""), std::string::npos) << msg;

  j = tiny_config_json();
  j.erase("hidden_size");
  msg = expect_input_error(j);
  EXPECT_NE(msg.find("missing field \"hidden_size\""), std::string::npos) << msg;

  j = tiny_config_json();
  j["num_key_value_heads"] = 3;
  msg = expect_input_error(j);
  EXPECT_NE(msg.find("not a multiple"), std::string::npos) << msg;

  j = tiny_config_json();
  j["hidden_act"] = "gelu";
  msg = expect_input_error(j);
  EXPECT_NE(msg.find("gelu"), std::string::npos) << msg;

  j = tiny_config_json();
  j["dtype"] = "float8";
  msg = expect_input_error(j);
  EXPECT_NE(msg.find("float8"), std::string::npos) << msg;

  j = tiny_config_json();
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  msg = expect_input_error(j);
  EXPECT_NE(msg.find("low_freq_factor"), std::string::npos) << msg;

  // RoPE settings whose frequencies would not be finite numbers.
  for (const double theta : {0.0, -10000.0}) {
    j = tiny_config_json();
    j["rope_parameters"]["rope_theta"] = theta;
    msg = expect_input_error(j);
    EXPECT_NE(msg.find("rope_theta must be positive"), std::string::npos) << msg;
  }
  j = tiny_config_json();
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 1e-300}, {"rope_theta", 10000.0}};
  msg = expect_input_error(j);
  EXPECT_NE(msg.find("gives a non-finite rotation frequency"), std::string::npos) << msg;
  j = tiny_config_json();
  j["rope_parameters"]["rope_theta"] = 1e-300;  // positive as a double, 0 as a float
  msg = expect_input_error(j);
  EXPECT_NE(msg.find("gives a non-finite rotation frequency"), std::string::npos) << msg;

  // A float where an integer belongs is refused, not cast (1e300 to int64 was undefined behaviour).
  j = tiny_config_json();
  j["pretraining_tp"] = 1e300;
  msg = expect_input_error(j);
  EXPECT_NE(msg.find("\"pretraining_tp\" is not an integer"), std::string::npos) << msg;

  try {
    parse_config("{\"architectures\": [", "/y/config.json");
    ADD_FAILURE();
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/y/config.json: malformed JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_model_config("/no/such/model"), core::InputError);
}

TEST(LlmConfig, BuiltinShapesHaveThePublishedParameterCounts) {
  EXPECT_EQ(builtin_config("llama2-7b").num_params(), 6738415616);
  EXPECT_EQ(builtin_config("llama2-13b").num_params(), 13015864320);
  EXPECT_EQ(builtin_config("llama2-70b").num_params(), 68976648192);
  EXPECT_EQ(builtin_config("llama3-8b").num_params(), 8030261248);
  EXPECT_EQ(builtin_config("llama3-70b").num_params(), 70553706496);
  EXPECT_EQ(config_from_arg("llama3-8b").num_kv_heads, 8);
  EXPECT_EQ(config_from_arg((testing::fixture_dir("llama_tiny") / "config.json").string()).hidden_size, 128);
  EXPECT_THROW(config_from_arg("llama9-1b"), core::InputError);
}

// The GPU load test's model (scripts/load_test.sh): llama3-8b's shape over the test tokenizer's
// vocabulary, so that every id dummy weights sample has text (or is a special token).
TEST(LlmConfig, LoadTestConfigIsLlama3ShapeOverTheTestTokenizersVocabulary) {
  const LlamaConfig load = config_from_arg(testing::fixture_dir("llama3_8b_shape_test_vocab.json").string());
  const LlamaConfig llama3 = builtin_config("llama3-8b");
  EXPECT_EQ(load.hidden_size, llama3.hidden_size);
  EXPECT_EQ(load.intermediate_size, llama3.intermediate_size);
  EXPECT_EQ(load.num_layers, llama3.num_layers);
  EXPECT_EQ(load.num_heads, llama3.num_heads);
  EXPECT_EQ(load.num_kv_heads, llama3.num_kv_heads);
  EXPECT_EQ(load.head_dim, llama3.head_dim);
  EXPECT_EQ(load.rope.theta, llama3.rope.theta);
  const int32_t tokens = Tokenizer::from_file(testing::fixture_dir("tokenizer_bytelevel")).vocab_size();
  EXPECT_EQ(load.vocab_size, tokens);
  EXPECT_EQ(load.eos_token_ids, (std::vector<int64_t>{1, 2}));  // <|end_of_text|>, <|eot_id|>
}

// The HF formulas written out again in double, independently of rope_inv_freq.
TEST(LlmConfig, RopeInvFreqMatchesHfFormulas) {
  const int64_t dim = 128;
  RopeConfig rope;
  rope.theta = 500000.0;
  auto base = [&](int64_t i) { return 1.0 / std::pow(rope.theta, 2.0 * i / dim); };
  auto near = [](double a, double b) { return std::abs(a - b) <= 2e-6 * std::abs(b); };

  auto standard = rope_inv_freq(rope, dim);
  ASSERT_EQ(standard.size(), 64u);
  for (int64_t i = 0; i < 64; ++i) EXPECT_TRUE(near(standard[i], base(i))) << i;

  rope.type = RopeType::linear;
  rope.factor = 4.0;
  auto linear = rope_inv_freq(rope, dim);
  for (int64_t i = 0; i < 64; ++i) EXPECT_TRUE(near(linear[i], base(i) / 4.0)) << i;

  rope.type = RopeType::llama3;
  rope.factor = 8.0;
  rope.low_freq_factor = 1.0;
  rope.high_freq_factor = 4.0;
  rope.original_max_position_embeddings = 8192;
  auto llama3 = rope_inv_freq(rope, dim);
  int low = 0, mid = 0, high = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const double f = base(i), wavelen = 2 * std::numbers::pi / f;
    double want;
    if (wavelen < 8192.0 / 4.0) {
      want = f, ++high;
    } else if (wavelen > 8192.0 / 1.0) {
      want = f / 8.0, ++low;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - smooth) * f / 8.0 + smooth * f, ++mid;
    }
    EXPECT_TRUE(near(llama3[i], want)) << i << ": " << llama3[i] << " vs " << want;
  }
  EXPECT_GT(low, 0);  // the test covers all three bands
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
}

}  // namespace
}  // namespace gpulab::llm

namespace gpulab::llm {
namespace {

TEST(LlmConfig, RopeInvFreqRoundsToTheCheckpointDtype) {
  RopeConfig rope;
  const auto f32 = rope_inv_freq(rope, 32);
  const auto bf16 = rope_inv_freq(rope, 32, core::DType::bf16);
  int differ = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    EXPECT_EQ(bf16[i], core::bf16_bits_to_float(core::float_to_bf16_bits(f32[i]))) << i;
    differ += bf16[i] != f32[i];
  }
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace gpulab::llm
