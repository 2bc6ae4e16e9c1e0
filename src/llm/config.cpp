#include "llm/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "core/error.h"

namespace gpulab::llm {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Reads and parses one JSON file; every problem names the file.
struct JsonFile {
  std::string path;
  json doc;

  [[noreturn]] void fail(const std::string& problem) const {
    throw core::InputError(path + ": " + problem);
  }

  const json& required(const json& obj, const std::string& key) const {
    if (!obj.contains(key) || obj[key].is_null()) fail("missing field \"" + key + "\"");
    return obj[key];
  }
  int64_t integer(const json& obj, const std::string& key) const {
    const json& v = required(obj, key);
    if (!v.is_number_integer()) fail("field \"" + key + "\" is not an integer");
    return v.get<int64_t>();
  }
  int64_t positive(const json& obj, const std::string& key) const {
    const int64_t v = integer(obj, key);
    if (v <= 0) fail("field \"" + key + "\" must be positive, is " + std::to_string(v));
    return v;
  }
  double number(const json& obj, const std::string& key) const {
    const json& v = required(obj, key);
    if (!v.is_number()) fail("field \"" + key + "\" is not a number");
    return v.get<double>();
  }
  template <class T>
  T optional(const json& obj, const std::string& key, T fallback) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    // nlohmann casts a float to an integer unchecked (1e300 -> undefined behaviour): integers take the
    // checked path.
    static_assert(!std::is_integral_v<T> || std::is_same_v<T, bool> || std::is_same_v<T, int64_t>);
    if constexpr (std::is_same_v<T, int64_t>) return integer(obj, key);
    try {
      return obj[key].get<T>();
    } catch (const json::exception&) {
      fail("field \"" + key + "\" has the wrong type");
    }
  }
  // bos/eos ids: an integer, or for eos a list of integers.
  std::vector<int64_t> token_ids(const json& obj, const std::string& key) const {
    std::vector<int64_t> ids;
    if (!obj.contains(key) || obj[key].is_null()) return ids;
    const json& v = obj[key];
    if (v.is_number_integer()) return {v.get<int64_t>()};
    if (!v.is_array()) fail("field \"" + key + "\" is neither an integer nor a list of integers");
    for (const json& id : v) {
      if (!id.is_number_integer()) fail("field \"" + key + "\" holds a non-integer");
      ids.push_back(id.get<int64_t>());
    }
    return ids;
  }
};

JsonFile parse_json(const std::string& text, const std::string& path) {
  JsonFile f{path, {}};
  try {
    f.doc = json::parse(text);
  } catch (const json::exception& e) {  // parse errors, and numbers beyond double (out_of_range)
    f.fail(std::string("malformed JSON: ") + e.what());
  }
  if (!f.doc.is_object()) f.fail("malformed config: the top level is not a JSON object");
  return f;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::InputError(path.string() + ": cannot open (no such file or not readable)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

core::DType parse_torch_dtype(const JsonFile& f, const std::string& name) {
  if (name == "bfloat16") return core::DType::bf16;
  if (name == "float16") return core::DType::f16;
  if (name == "float32") return core::DType::f32;
  f.fail("unsupported dtype \"" + name + "\" (supported: bfloat16, float16, float32)");
}

// transformers 5 keeps rope settings in "rope_parameters" (theta inside); transformers 4 has
// "rope_theta" at the top level and an optional "rope_scaling" object.
RopeConfig parse_rope(const JsonFile& f) {
  const json& doc = f.doc;
  RopeConfig rope;
  const json* params = nullptr;
  if (doc.contains("rope_parameters") && !doc["rope_parameters"].is_null()) {
    params = &doc["rope_parameters"];
    if (!params->is_object()) f.fail("field \"rope_parameters\" is not an object");
    rope.theta = params->contains("rope_theta") ? f.number(*params, "rope_theta")
                                                : f.optional<double>(doc, "rope_theta", 10000.0);
  } else {
    rope.theta = f.optional<double>(doc, "rope_theta", 10000.0);
    if (doc.contains("rope_scaling") && !doc["rope_scaling"].is_null()) {
      params = &doc["rope_scaling"];
      if (!params->is_object()) f.fail("field \"rope_scaling\" is not an object");
    }
  }
  if (!params) return rope;
  // transformers 4 wrote "type" before "rope_type".
  std::string type = f.optional<std::string>(*params, "rope_type", "");
  if (type.empty()) type = f.optional<std::string>(*params, "type", "default");
  if (type == "default") {
    rope.type = RopeType::standard;
  } else if (type == "linear") {
    rope.type = RopeType::linear;
    rope.factor = f.number(*params, "factor");
  } else if (type == "llama3") {
    rope.type = RopeType::llama3;
    rope.factor = f.number(*params, "factor");
    rope.low_freq_factor = f.number(*params, "low_freq_factor");
    rope.high_freq_factor = f.number(*params, "high_freq_factor");
    rope.original_max_position_embeddings = f.positive(*params, "original_max_position_embeddings");
    if (rope.high_freq_factor <= rope.low_freq_factor)
      f.fail("rope llama3: high_freq_factor must exceed low_freq_factor");
  } else {
    f.fail("unsupported rope type \"" + type + "\" (supported: default, linear, llama3)");
  }
  if (rope.factor <= 0) f.fail("rope factor must be positive");
  return rope;
}

void check_shape(const JsonFile& f, const LlamaConfig& c) {
  // Bounds far beyond any released model keep sizes and parameter counts within int64_t.
  auto at_most = [&](const char* what, int64_t value, int64_t limit) {
    if (value > limit)
      f.fail(std::string(what) + " " + std::to_string(value) + " is implausibly large (at most " + std::to_string(limit) + ")");
  };
  at_most("hidden_size", c.hidden_size, int64_t{1} << 20);
  at_most("intermediate_size", c.intermediate_size, int64_t{1} << 22);
  at_most("num_hidden_layers", c.num_layers, int64_t{1} << 12);
  at_most("vocab_size", c.vocab_size, int64_t{1} << 24);
  at_most("head_dim", c.head_dim, int64_t{1} << 12);
  at_most("num_attention_heads", c.num_heads, int64_t{1} << 12);
  at_most("max_position_embeddings", c.max_position_embeddings, int64_t{1} << 32);
  if (c.num_heads % c.num_kv_heads != 0)
    f.fail("num_attention_heads (" + std::to_string(c.num_heads) + ") is not a multiple of num_key_value_heads (" +
           std::to_string(c.num_kv_heads) + ")");
  if (c.head_dim % 2 != 0) f.fail("head_dim must be even for RoPE, is " + std::to_string(c.head_dim));
  if (c.rms_norm_eps <= 0) f.fail("rms_norm_eps must be positive");
  // A rotation by inf or NaN would make every logit NaN at the first token: theta 0, or a
  // scaling factor below float's range (1e-300), divides by zero in float.
  if (c.rope.theta <= 0) f.fail("rope_theta must be positive");
  for (const float freq : rope_inv_freq(c.rope, c.head_dim))
    if (!std::isfinite(freq))
      f.fail("rope_theta " + std::to_string(c.rope.theta) + " with rope factor " + std::to_string(c.rope.factor) +
             " gives a non-finite rotation frequency");
}

}  // namespace

int64_t LlamaConfig::num_params() const {
  int64_t n = 0;
  for (const WeightSpec& w : weight_specs(*this)) {
    int64_t e = 1;
    for (int64_t d : w.shape) e *= d;
    n += e;
  }
  return n;
}

LlamaConfig parse_config(const std::string& json_text, const std::string& path) {
  const JsonFile f = parse_json(json_text, path);
  const json& doc = f.doc;
  LlamaConfig c;

  const json& archs = f.required(doc, "architectures");
  if (!archs.is_array() || archs.size() != 1 || !archs[0].is_string())
    f.fail("field \"architectures\" must be a list of one name");
  c.architecture = archs[0].get<std::string>();
  const bool is_llama = c.architecture == "LlamaForCausalLM";
  const bool is_mistral = c.architecture == "MistralForCausalLM";
  const bool is_qwen2 = c.architecture == "Qwen2ForCausalLM";
  if (!is_llama && !is_mistral && !is_qwen2)
    f.fail("unsupported architecture \"" + c.architecture +
           "\" (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");

  const std::string act = f.optional<std::string>(doc, "hidden_act", "silu");
  if (act != "silu") f.fail("unsupported hidden_act \"" + act + "\" (only silu)");
  if (f.optional<bool>(doc, "mlp_bias", false)) f.fail("unsupported: mlp_bias = true");
  if (f.optional<int64_t>(doc, "pretraining_tp", 1) != 1) f.fail("unsupported: pretraining_tp != 1");

  c.hidden_size = f.positive(doc, "hidden_size");
  c.intermediate_size = f.positive(doc, "intermediate_size");
  c.num_layers = f.positive(doc, "num_hidden_layers");
  c.num_heads = f.positive(doc, "num_attention_heads");
  c.num_kv_heads = doc.contains("num_key_value_heads") && !doc["num_key_value_heads"].is_null()
                       ? f.positive(doc, "num_key_value_heads")
                       : c.num_heads;
  if (doc.contains("head_dim") && !doc["head_dim"].is_null()) {
    c.head_dim = f.positive(doc, "head_dim");
  } else {
    if (c.hidden_size % c.num_heads != 0)
      f.fail("hidden_size (" + std::to_string(c.hidden_size) + ") is not a multiple of num_attention_heads (" +
             std::to_string(c.num_heads) + ") and there is no head_dim");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.vocab_size = f.positive(doc, "vocab_size");
  c.max_position_embeddings = f.positive(doc, "max_position_embeddings");
  c.rms_norm_eps = f.number(doc, "rms_norm_eps");
  c.rope = parse_rope(f);
  c.tie_word_embeddings = f.optional<bool>(doc, "tie_word_embeddings", false);
  if (is_qwen2) {
    c.qkv_bias = true;  // Qwen2 has q/k/v biases and no o bias, whatever the config says
  } else {
    c.qkv_bias = c.o_bias = f.optional<bool>(doc, "attention_bias", false);
  }
  // Sliding-window attention (Mistral, some Qwen2) equals full attention up to the window.
  if (doc.contains("sliding_window") && doc["sliding_window"].is_number_integer() &&
      (!is_qwen2 || f.optional<bool>(doc, "use_sliding_window", false)))
    c.max_position_embeddings = std::min(c.max_position_embeddings, f.positive(doc, "sliding_window"));

  const json* dtype = doc.contains("dtype") && !doc["dtype"].is_null() ? &doc["dtype"]
                      : doc.contains("torch_dtype")                    ? &doc["torch_dtype"]
                                                                       : nullptr;
  if (dtype && !dtype->is_null()) {
    if (!dtype->is_string()) f.fail("field \"dtype\" is not a string");
    c.dtype = parse_torch_dtype(f, dtype->get<std::string>());
  }
  const auto bos = f.token_ids(doc, "bos_token_id");
  if (bos.size() > 1) f.fail("field \"bos_token_id\" must be one integer");
  if (!bos.empty()) c.bos_token_id = bos[0];
  c.eos_token_ids = f.token_ids(doc, "eos_token_id");
  check_shape(f, c);
  return c;
}

LlamaConfig read_config_file(const fs::path& path) { return parse_config(read_text(path), path.string()); }

LlamaConfig read_model_config(const fs::path& dir) {
  if (!fs::is_directory(dir)) throw core::InputError(dir.string() + ": not a checkpoint folder (no such directory)");
  LlamaConfig c = read_config_file(dir / "config.json");
  const fs::path gen_path = dir / "generation_config.json";
  if (fs::exists(gen_path)) {
    const JsonFile g = parse_json(read_text(gen_path), gen_path.string());
    const auto bos = g.token_ids(g.doc, "bos_token_id");
    if (bos.size() > 1) g.fail("field \"bos_token_id\" must be one integer");
    if (!bos.empty()) c.bos_token_id = bos[0];
    const auto eos = g.token_ids(g.doc, "eos_token_id");
    if (!eos.empty()) c.eos_token_ids = eos;
  }
  return c;
}

LlamaConfig builtin_config(const std::string& name) {
  // Dimensions of the published Hugging Face checkpoints.
  struct Shape {
    const char* name;
    int64_t hidden, intermediate, layers, heads, kv_heads, vocab, max_pos;
    double theta;
    int64_t bos, eos;
  };
  static constexpr Shape kShapes[] = {
      {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0, 1, 2},
      {"llama2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, 10000.0, 1, 2},
      {"llama2-70b", 8192, 28672, 80, 64, 8, 32000, 4096, 10000.0, 1, 2},
      {"llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0, 128000, 128001},
      {"llama3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, 500000.0, 128000, 128001},
  };
  for (const Shape& s : kShapes) {
    if (name != s.name) continue;
    LlamaConfig c;
    c.hidden_size = s.hidden;
    c.intermediate_size = s.intermediate;
    c.num_layers = s.layers;
    c.num_heads = s.heads;
    c.num_kv_heads = s.kv_heads;
    c.head_dim = s.hidden / s.heads;
    c.vocab_size = s.vocab;
    c.max_position_embeddings = s.max_pos;
    c.rms_norm_eps = 1e-5;
    c.rope.theta = s.theta;
    c.bos_token_id = s.bos;
    c.eos_token_ids = {s.eos};
    return c;
  }
  std::string names;
  for (const std::string& n : builtin_config_names()) names += (names.empty() ? "" : ", ") + n;
  throw core::InputError("unknown model shape \"" + name + "\" (built-in: " + names + "; or give a config.json path)");
}

std::vector<std::string> builtin_config_names() {
  return {"llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b"};
}

LlamaConfig config_from_arg(const std::string& name_or_path) {
  const fs::path p(name_or_path);
  if (fs::is_directory(p)) return read_model_config(p);
  if (fs::exists(p) || name_or_path.find('/') != std::string::npos || p.extension() == ".json")
    return read_config_file(p);
  return builtin_config(name_or_path);
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim, core::DType dtype) {
  std::vector<float> inv(head_dim / 2);
  const float base = static_cast<float>(rope.theta);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    // As transformers: arange(0, dim, 2).float() / dim, base ** that, all in float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(base, exponent);
  }
  const float factor = static_cast<float>(rope.factor);
  if (rope.type == RopeType::linear) {
    for (float& f : inv) f /= factor;
  } else if (rope.type == RopeType::llama3) {
    const float old_len = static_cast<float>(rope.original_max_position_embeddings);
    const float low = static_cast<float>(rope.low_freq_factor), high = static_cast<float>(rope.high_freq_factor);
    const float low_freq_wavelen = old_len / low, high_freq_wavelen = old_len / high;
    for (float& f : inv) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
      if (wavelen > low_freq_wavelen) {
        f /= factor;  // long wavelengths: fully interpolated
      } else if (wavelen >= high_freq_wavelen) {
        const float smooth = (old_len / wavelen - low) / (high - low);
        f = (1.0f - smooth) * f / factor + smooth * f;
      }
    }
  }
  for (float& f : inv) {
    if (dtype == core::DType::bf16) f = core::bf16_bits_to_float(core::float_to_bf16_bits(f));
    if (dtype == core::DType::f16) f = core::f16_bits_to_float(core::float_to_f16_bits(f));
  }
  return inv;
}

bool is_linear_weight(const std::string& name) { return name.ends_with("_proj.weight"); }

std::string layer_weight(int64_t layer, const std::string& suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

std::vector<WeightSpec> weight_specs(const LlamaConfig& c) {
  const int64_t h = c.hidden_size;
  std::vector<WeightSpec> w;
  w.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto add = [&](const std::string& suffix, std::vector<int64_t> shape) { w.push_back({layer_weight(l, suffix), shape}); };
    add("input_layernorm.weight", {h});
    add("self_attn.q_proj.weight", {c.q_dim(), h});
    add("self_attn.k_proj.weight", {c.kv_dim(), h});
    add("self_attn.v_proj.weight", {c.kv_dim(), h});
    add("self_attn.o_proj.weight", {h, c.q_dim()});
    if (c.qkv_bias) {
      add("self_attn.q_proj.bias", {c.q_dim()});
      add("self_attn.k_proj.bias", {c.kv_dim()});
      add("self_attn.v_proj.bias", {c.kv_dim()});
    }
    if (c.o_bias) add("self_attn.o_proj.bias", {h});
    add("post_attention_layernorm.weight", {h});
    add("mlp.gate_proj.weight", {c.intermediate_size, h});
    add("mlp.up_proj.weight", {c.intermediate_size, h});
    add("mlp.down_proj.weight", {h, c.intermediate_size});
  }
  w.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) w.push_back({"lm_head.weight", {c.vocab_size, h}});
  return w;
}

}  // namespace gpulab::llm
