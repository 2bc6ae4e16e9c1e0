// LLaMA-family model configuration: read from a Hugging Face checkpoint's config.json
// (transformers 4 and 5 styles) and generation_config.json, or taken from a built-in shape for
// runs on random weights. Also lists the tensors a checkpoint must hold, with their shapes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace gpulab::llm {

enum class RopeType { standard, linear, llama3 };  // HF rope_type "default", "linear", "llama3"

struct RopeConfig {
  RopeType type = RopeType::standard;
  double theta = 10000.0;
  double factor = 1.0;  // linear and llama3
  double low_freq_factor = 1.0;  // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct LlamaConfig {
  std::string architecture = "LlamaForCausalLM";
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2 always; Llama with attention_bias
  bool o_bias = false;    // Llama with attention_bias
  core::DType dtype = core::DType::bf16;  // the checkpoint's declared dtype
  int64_t bos_token_id = -1;              // -1: none
  std::vector<int64_t> eos_token_ids;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Parameters of the whole model (for reports and memory planning).
  int64_t num_params() const;
};

// Parses a config.json. Throws core::InputError naming `path` and the problem (malformed JSON,
// missing field, unsupported architecture, activation or rope type).
LlamaConfig parse_config(const std::string& json_text, const std::string& path);
LlamaConfig read_config_file(const std::filesystem::path& path);

// Reads `dir`/config.json and, where present, `dir`/generation_config.json (its bos/eos win).
LlamaConfig read_model_config(const std::filesystem::path& dir);

// A built-in shape ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b") or a
// config.json path: what `--config FILE|NAME` accepts.
LlamaConfig builtin_config(const std::string& name);
std::vector<std::string> builtin_config_names();
LlamaConfig config_from_arg(const std::string& name_or_path);

// RoPE inverse frequencies [head_dim / 2], computed in float as transformers does, then
// rounded to `dtype`: transformers holds them in a buffer that takes the model's dtype when a
// bf16/fp16 checkpoint is loaded, and keeps the rounded values when the model is upcast, so a
// bf16 checkpoint rotates by bf16 frequencies even in its float32 forward.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim,
                                 core::DType dtype = core::DType::f32);

// The tensors a checkpoint of this config holds, in HF names, with their shapes.
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<WeightSpec> weight_specs(const LlamaConfig& cfg);
std::string layer_weight(int64_t layer, const std::string& suffix);  // model.layers.N.suffix
// A linear layer's weight (q/k/v/o, gate/up/down): what --weights fp8 holds in e4m3.
bool is_linear_weight(const std::string& name);

}  // namespace gpulab::llm
