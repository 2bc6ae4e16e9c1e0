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

bool is_float16_or_32(core::DType dt) {
  return dt == core::DType::f32 || dt == core::DType::f16 || dt == core::DType::bf16;
}

// An fp8 tensor needs its `<name>_scale`: one float value, or one per row.
void check_fp8_scale(const core::Checkpoint& ckpt, const fs::path& dir, const WeightSpec& s) {
  const std::string scale_name = s.name + "_scale";
  const core::Checkpoint::Entry* e = ckpt.find(scale_name);
  if (!e) {
    const bool blocks = ckpt.find(s.name + "_scale_inv") != nullptr;
    throw core::InputError(dir.string() + ": fp8 tensor '" + s.name + "' has no '" + scale_name + "'" +
                           (blocks ? " (block-scaled fp8 with weight_scale_inv is not supported: only per-tensor "
                                     "and per-channel scales)"
                                   : ""));
  }
  const int64_t n = numel(e->info->shape), rows = s.shape.empty() ? 1 : s.shape[0];
  const bool per_row_shape = e->info->shape == std::vector<int64_t>{rows} ||
                             e->info->shape == std::vector<int64_t>{rows, 1};
  if (!is_float16_or_32(e->info->dtype) || !(n == 1 || per_row_shape))
    throw core::InputError(dir.string() + ": '" + scale_name + "' has dtype " +
                           std::string(core::dtype_name(e->info->dtype)) + " and shape " + shape_text(e->info->shape) +
                           " (want a float scale of shape [] or [1] per tensor, or [" + std::to_string(rows) + "] or [" +
                           std::to_string(rows) + ", 1] per output channel)");
  // A weight is scale · e4m3: an inf or NaN scale would give NaN logits at the first request, far
  // from the file that caused them. (0 is a quantizer's honest scale for a row of zeros.)
  const auto bytes = ckpt.data(*e);
  for (int64_t i = 0; i < n; ++i)
    if (const double v = core::load_as_double(bytes.data(), e->info->dtype, i); !std::isfinite(v))
      throw core::InputError(dir.string() + ": '" + scale_name + "' holds " + std::to_string(v) + " at index " +
                             std::to_string(i) + " (an fp8 scale must be finite)");
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
    if (dt == core::DType::f8e4m3) {
      check_fp8_scale(*w.checkpoint_, dir, s);
      continue;
    }
    if (!is_float16_or_32(dt))
      throw core::InputError(dir.string() + ": tensor '" + s.name + "' has dtype " +
                             std::string(core::dtype_name(dt)) + " (supported: fp32, fp16, bf16, fp8e4m3 with a scale)");
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

SliceRuns WeightSource::slice_runs(const std::string& name, const TensorSlice& s) const {
  const std::vector<int64_t>& shape = spec(name).shape;
  const bool dim_ok = (s.dim == 0 || s.dim == 1) && s.dim < static_cast<int>(shape.size());
  const int64_t extent = dim_ok ? shape[s.dim] : -1;
  const int64_t count = s.count < 0 ? extent - s.begin : s.count;
  if (!dim_ok || s.begin < 0 || count < 0 || s.begin + count > extent)
    throw core::Error("slice [" + std::to_string(s.begin) + ", +" + std::to_string(s.count) + ") of dim " +
                      std::to_string(s.dim) + " lies outside '" + name + "' " + shape_text(shape));
  SliceRuns r;
  r.shape = shape;
  r.shape[s.dim] = count;
  if (s.dim == 0) {
    const int64_t inner = numel(shape) / std::max<int64_t>(shape[0], 1);
    r.length = count * inner;
    r.first = s.begin * inner;
  } else {
    r.runs = shape[0];
    r.length = count;
    r.first = s.begin;
    r.stride = shape[1];
  }
  return r;
}

std::vector<float> WeightSource::load_f32(const std::string& name, const TensorSlice& slice) const {
  const SliceRuns r = slice_runs(name, slice);
  std::vector<float> out(r.numel());
  if (!checkpoint_) {
    const RandomFill fill = random_fill(name, seed_);
    r.for_each([&](int64_t src, int64_t dst, int64_t n) {
      for (int64_t i = 0; i < n; ++i) out[dst + i] = random_value(fill, src + i);
    });
    return out;
  }
  const core::Checkpoint::Entry& e = checkpoint_->at(name);
  const auto bytes = checkpoint_->data(e);
  const core::DType dt = e.info->dtype;
  // fp8 tensors come back dequantized: one scale per row of the whole tensor.
  const std::vector<float> scales = dt == core::DType::f8e4m3 ? fp8_row_scales(name) : std::vector<float>{};
  const int64_t cols = scales.empty() ? 1 : numel(spec(name).shape) / static_cast<int64_t>(scales.size());
  r.for_each([&](int64_t src, int64_t dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(core::load_as_double(bytes.data(), dt, src + i));
      out[dst + i] = scales.empty() ? v : v * scales[(src + i) / cols];
    }
  });
  return out;
}

bool WeightSource::is_fp8(const std::string& name) const {
  return checkpoint_ && checkpoint_->at(name).info->dtype == core::DType::f8e4m3;
}

std::span<const uint8_t> WeightSource::fp8_bytes(const std::string& name) const {
  if (!is_fp8(name)) throw core::Error("weight '" + name + "' is not stored in fp8");
  return checkpoint_->data(checkpoint_->at(name));
}

std::vector<float> WeightSource::fp8_row_scales(const std::string& name) const {
  if (!is_fp8(name)) throw core::Error("weight '" + name + "' is not stored in fp8");
  const int64_t rows = spec(name).shape.empty() ? 1 : spec(name).shape[0];
  const core::Checkpoint::Entry& e = checkpoint_->at(name + "_scale");
  const auto bytes = checkpoint_->data(e);
  std::vector<float> out(rows);
  const bool per_tensor = numel(e.info->shape) == 1;
  for (int64_t r = 0; r < rows; ++r)
    out[r] = static_cast<float>(core::load_as_double(bytes.data(), e.info->dtype, per_tensor ? 0 : r));
  return out;
}

std::vector<uint16_t> WeightSource::load_bf16(const std::string& name, const TensorSlice& slice) const {
  if (checkpoint_ && checkpoint_->at(name).info->dtype == core::DType::bf16) {
    const SliceRuns r = slice_runs(name, slice);
    const uint8_t* bytes = checkpoint_->data(checkpoint_->at(name)).data();
    std::vector<uint16_t> out(r.numel());
    r.for_each([&](int64_t src, int64_t dst, int64_t n) {
      if (n > 0) std::memcpy(out.data() + dst, bytes + 2 * src, 2 * n);  // an empty slice has no buffer at all
    });
    return out;
  }
  const std::vector<float> f = load_f32(name, slice);
  std::vector<uint16_t> out(f.size());
  std::transform(f.begin(), f.end(), out.begin(), core::float_to_bf16_bits);
  return out;
}

}  // namespace gpulab::llm
