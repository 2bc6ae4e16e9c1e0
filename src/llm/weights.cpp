#include "llm/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/dtype.h"
#include "core/error.h"

namespace gpulab::llm {

namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

RandomFill random_fill(const std::string& name, uint64_t seed) {
  const uint64_t stream = std::hash<std::string>{}(name) ^ (seed * 0xD1B54A32D192ED03ull);
  if (name.ends_with("norm.weight")) return {stream, 0.0f, 1.0f};
  // std 0.02 as HF initializes; uniform on [-a, a] has std a/sqrt(3).
  return {stream, 0.02f * std::sqrt(3.0f), 0.0f};
}

WeightSource WeightSource::from_checkpoint(const fs::path& dir) {
  WeightSource w;
  w.config_ = read_model_config(dir);
  w.specs_ = weight_specs(w.config_);
  w.checkpoint_ = std::make_shared<const core::Checkpoint>(dir);
  for (const WeightSpec& s : w.specs_) {
    const core::Checkpoint::Entry* e = w.checkpoint_->find(s.name);
    if (!e)
      throw core::InputError(dir.string() + ": tensor '" + s.name + "' is missing (expected shape " +
                             shape_text(s.shape) + " for this config.json)");
    if (e->info->shape != s.shape)
      throw core::InputError(dir.string() + ": tensor '" + s.name + "' has shape " + shape_text(e->info->shape) +
                             " but config.json implies " + shape_text(s.shape));
    const core::DType dt = e->info->dtype;
    if (dt != core::DType::f32 && dt != core::DType::f16 && dt != core::DType::bf16)
      throw core::InputError(dir.string() + ": tensor '" + s.name + "' has dtype " +
                             std::string(core::dtype_name(dt)) + " (supported: fp32, fp16, bf16)");
  }
  return w;
}

WeightSource WeightSource::random(const LlamaConfig& config, uint64_t seed) {
  WeightSource w;
  w.config_ = config;
  w.specs_ = weight_specs(config);
  w.seed_ = seed;
  return w;
}

const WeightSpec& WeightSource::spec(const std::string& name) const {
  for (const WeightSpec& s : specs_)
    if (s.name == name) return s;
  throw core::Error("no weight named '" + name + "' in this model");
}

std::vector<float> WeightSource::load_f32(const std::string& name) const {
  const WeightSpec& s = spec(name);
  std::vector<float> out(numel(s.shape));
  if (!checkpoint_) {
    const RandomFill fill = random_fill(name, seed_);
    for (size_t i = 0; i < out.size(); ++i) out[i] = random_value(fill, i);
    return out;
  }
  const core::Checkpoint::Entry& e = checkpoint_->at(name);
  const auto bytes = checkpoint_->data(e);
  const core::DType dt = e.info->dtype;
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(core::load_as_double(bytes.data(), dt, i));
  return out;
}

std::vector<uint16_t> WeightSource::load_bf16(const std::string& name) const {
  if (checkpoint_ && checkpoint_->at(name).info->dtype == core::DType::bf16) {
    const auto bytes = checkpoint_->data(checkpoint_->at(name));
    std::vector<uint16_t> out(bytes.size() / 2);
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  const std::vector<float> f = load_f32(name);
  std::vector<uint16_t> out(f.size());
  std::transform(f.begin(), f.end(), out.begin(), core::float_to_bf16_bits);
  return out;
}

}  // namespace gpulab::llm
