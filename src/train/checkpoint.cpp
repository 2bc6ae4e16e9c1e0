#include "train/checkpoint.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/safetensors.h"

namespace gpulab::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "gpulab-resnet-checkpoint-1";

// One tensor of the torchvision state_dict and where it lives in ModelState.
struct Slot {
  enum Kind { param, mean, var, tracked } kind;
  std::string name;
  int64_t offset = 0;  // into params, or into running_mean/var
  int64_t count = 1;
  std::vector<int64_t> shape;  // torchvision's
  int conv = -1;               // a conv weight: index into layout.convs (stored permuted)
};

// In torchvision's state_dict order: each conv's weight, then its BN's weight, bias, running
// mean, running variance and batch count; fc last.
std::vector<Slot> slots(const ResNetLayout& layout) {
  std::vector<Slot> out;
  int64_t p = 0, stat = 0;
  for (size_t i = 0; i < layout.convs.size(); ++i) {
    const ConvSpec& c = layout.convs[i];
    const int64_t w = int64_t(c.out) * c.in * c.kernel * c.kernel;
    out.push_back({Slot::param, c.name + ".weight", p, w, {c.out, c.in, c.kernel, c.kernel}, int(i)});
    p += w;
    out.push_back({Slot::param, c.bn_name + ".weight", p, c.out, {c.out}});
    p += c.out;
    out.push_back({Slot::param, c.bn_name + ".bias", p, c.out, {c.out}});
    p += c.out;
    out.push_back({Slot::mean, c.bn_name + ".running_mean", stat, c.out, {c.out}});
    out.push_back({Slot::var, c.bn_name + ".running_var", stat, c.out, {c.out}});
    out.push_back({Slot::tracked, c.bn_name + ".num_batches_tracked", 0, 1, {}});
    stat += c.out;
  }
  const int64_t fc = int64_t(layout.classes) * layout.features;
  out.push_back({Slot::param, "fc.weight", p, fc, {layout.classes, layout.features}});
  out.push_back({Slot::param, "fc.bias", p + fc, layout.classes, {layout.classes}});
  return out;
}

std::vector<float> permute(const float* w, int out, int in, int k, bool to_oihw) {
  std::vector<float> r(size_t(out) * in * k * k);
  for (int o = 0; o < out; ++o)
    for (int c = 0; c < in; ++c)
      for (int y = 0; y < k; ++y)
        for (int x = 0; x < k; ++x) {
          const size_t ohwi = ((size_t(o) * k + y) * k + x) * in + c;
          const size_t oihw = ((size_t(o) * in + c) * k + y) * k + x;
          if (to_oihw) r[oihw] = w[ohwi];
          else r[ohwi] = w[oihw];
        }
  return r;
}

// Tensors to write; permuted ones own their bytes here (a moved vector keeps its buffer).
struct Writer {
  std::vector<core::TensorToWrite> tensors;
  std::vector<std::vector<float>> owned;

  void add(const std::string& name, core::DType dt, std::vector<int64_t> shape, const void* data, size_t bytes) {
    tensors.push_back({name, dt, std::move(shape), {static_cast<const uint8_t*>(data), bytes}});
  }
  // A parameter-shaped array (params or a moment), conv weights turned to OIHW.
  void add_param(const std::string& name, const Slot& s, const ResNetLayout& layout, const std::vector<float>& packed) {
    const float* src = packed.data() + s.offset;
    if (s.conv >= 0) {
      const ConvSpec& c = layout.convs[size_t(s.conv)];
      owned.push_back(ohwi_to_oihw(src, c.out, c.in, c.kernel));
      src = owned.back().data();
    }
    add(name, core::DType::f32, s.shape, src, size_t(s.count) * sizeof(float));
  }
  void add_model(const ResNetLayout& layout, const ModelState& m) {
    for (const Slot& s : slots(layout)) {
      switch (s.kind) {
        case Slot::param: add_param(s.name, s, layout, m.params); break;
        case Slot::mean: add(s.name, core::DType::f32, s.shape, m.running_mean.data() + s.offset, size_t(s.count) * 4); break;
        case Slot::var: add(s.name, core::DType::f32, s.shape, m.running_var.data() + s.offset, size_t(s.count) * 4); break;
        case Slot::tracked: add(s.name, core::DType::i64, s.shape, &m.batches_tracked, sizeof(int64_t)); break;
      }
    }
  }
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Depth counts the weighted layers: the stem, the main path of every block, the classifier. The
// width (the stem's channels) is named where it is not ResNet's 64.
std::string model_text(const ResNetLayout& layout) {
  size_t depth = 2;
  for (const auto& b : layout.blocks) depth += b.convs.size();
  const int width = layout.convs.front().out;
  return "ResNet-" + std::to_string(depth) + (width != 64 ? " of width " + std::to_string(width) : "") + " with " +
         std::to_string(layout.classes) + " classes";
}

// A value for a message: "-1e-09", not std::to_string's "-0.000000".
std::string value_text(float v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

// What a tensor's values may be: a variance (BN's running one, LAMB's second moment) is under a
// square root, so a negative one would turn training into NaN steps later, far from its cause.
enum class Values { finite, non_negative };

// The tensor `name` as float, of exactly `shape`, every value finite (and non-negative when asked);
// nullopt when absent and !required.
std::optional<std::vector<float>> read_floats(const core::SafetensorsFile& f, const std::string& name,
                                              const std::vector<int64_t>& shape, const ResNetLayout& layout,
                                              bool required = true, Values values = Values::finite) {
  const core::TensorInfo* t = f.find(name);
  if (!t) {
    if (!required) return std::nullopt;
    throw core::InputError(f.path().string() + ": no tensor '" + name + "' (a " + model_text(layout) +
                           " needs it: wrong --depth or not a torchvision ResNet state dict?)");
  }
  if (t->shape != shape)
    throw core::InputError(f.path().string() + ": '" + name + "' has shape " + shape_text(t->shape) + ", a " +
                           model_text(layout) + " needs " + shape_text(shape) + " (wrong --depth, --width or --classes?)");
  const auto bytes = f.data(*t);
  std::vector<float> out(t->numel());
  switch (t->dtype) {
    case core::DType::f32: std::memcpy(out.data(), bytes.data(), bytes.size()); break;
    case core::DType::f16:
    case core::DType::bf16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        out[i] = t->dtype == core::DType::f16 ? core::f16_bits_to_float(b) : core::bf16_bits_to_float(b);
      }
      break;
    default:
      throw core::InputError(f.path().string() + ": '" + name + "' is " + std::string(core::dtype_name(t->dtype)) +
                             ", expected fp32, fp16 or bf16");
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (!std::isfinite(out[i]) || (values == Values::non_negative && out[i] < 0))
      throw core::InputError(f.path().string() + ": '" + name + "' holds " + value_text(out[i]) + " at index " +
                             std::to_string(i) + (values == Values::non_negative ? ", not a finite variance" : ""));
  return out;
}

// A scalar of an integer type (num_batches_tracked, counters), in [0, most].
std::optional<int64_t> read_integer(const core::SafetensorsFile& f, const std::string& name, bool required,
                                    int64_t most = std::numeric_limits<int32_t>::max()) {
  const core::TensorInfo* t = f.find(name);
  if (!t) {
    if (!required) return std::nullopt;
    throw core::InputError(f.path().string() + ": no tensor '" + name + "'");
  }
  if (t->numel() != 1 || (t->dtype != core::DType::i64 && t->dtype != core::DType::i32))
    throw core::InputError(f.path().string() + ": '" + name + "' is not one int32/int64 value");
  const auto bytes = f.data(*t);
  int64_t v;
  if (t->dtype == core::DType::i32) {
    int32_t v32;
    std::memcpy(&v32, bytes.data(), 4);
    v = v32;
  } else {
    std::memcpy(&v, bytes.data(), 8);
  }
  if (v < 0 || v > most)
    throw core::InputError(f.path().string() + ": '" + name + "' is " + std::to_string(v) + ", outside [0, " +
                           std::to_string(most) + "]");
  return v;
}

void put_param(std::vector<float>& packed, const Slot& s, const ResNetLayout& layout, const std::vector<float>& v) {
  if (s.conv >= 0) {
    const ConvSpec& c = layout.convs[size_t(s.conv)];
    const std::vector<float> w = oihw_to_ohwi(v.data(), c.out, c.in, c.kernel);
    std::copy(w.begin(), w.end(), packed.begin() + s.offset);
  } else {
    std::copy(v.begin(), v.end(), packed.begin() + s.offset);
  }
}

std::vector<float> read_params_as(const core::SafetensorsFile& f, const ResNetLayout& layout, const std::string& prefix,
                                  Values values) {
  std::vector<float> packed(size_t(resnet_param_count(layout)));
  for (const Slot& s : slots(layout))
    if (s.kind == Slot::param) put_param(packed, s, layout, *read_floats(f, prefix + s.name, s.shape, layout, true, values));
  return packed;
}

ModelState read_model(const core::SafetensorsFile& f, const ResNetLayout& layout, const std::string& prefix) {
  ModelState m;
  m.params = read_params_as(f, layout, prefix, Values::finite);
  m.running_mean.resize(size_t(resnet_stat_count(layout)));
  m.running_var.resize(m.running_mean.size());
  for (const Slot& s : slots(layout)) {
    if (s.kind == Slot::tracked)  // the same in every BN; absent in some exports
      m.batches_tracked = read_integer(f, prefix + s.name, false, std::numeric_limits<int64_t>::max())
                              .value_or(m.batches_tracked);
    if (s.kind != Slot::mean && s.kind != Slot::var) continue;
    const std::vector<float> v =
        *read_floats(f, prefix + s.name, s.shape, layout, true, s.kind == Slot::var ? Values::non_negative : Values::finite);
    std::copy(v.begin(), v.end(), (s.kind == Slot::mean ? m.running_mean : m.running_var).begin() + s.offset);
  }
  return m;
}

// Metadata `key` as a non-negative decimal integer, the whole text of it.
bool parse_count(const std::map<std::string, std::string>& meta, const std::string& key, int64_t* out) {
  const auto it = meta.find(key);
  if (it == meta.end()) return false;
  const std::string& text = it->second;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return !text.empty() && error == std::errc{} && end == text.data() + text.size() && *out >= 0;
}

const char* const kMomentNames[] = {"optimizer.m.", "optimizer.v."};

}  // namespace

std::vector<float> ohwi_to_oihw(const float* w, int out, int in, int k) { return permute(w, out, in, k, true); }
std::vector<float> oihw_to_ohwi(const float* w, int out, int in, int k) { return permute(w, out, in, k, false); }

void write_torchvision(const fs::path& path, const ResNetLayout& layout, const ModelState& model) {
  Writer w;
  w.add_model(layout, model);
  core::write_safetensors(path, w.tensors, {{"format", "pt"}, {"model", model_text(layout)}});
}

ModelState read_torchvision(const fs::path& path, const ResNetLayout& layout, const std::string& prefix) {
  return read_model(core::SafetensorsFile(path), layout, prefix);
}

std::vector<float> read_param_tensors(const core::SafetensorsFile& f, const ResNetLayout& layout,
                                      const std::string& prefix) {
  return read_params_as(f, layout, prefix, Values::finite);
}

fs::path checkpoint_file(const fs::path& dir) { return dir / "checkpoint.safetensors"; }

void write_checkpoint(const fs::path& dir, const ResNetLayout& layout, const TrainState& st) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw core::Error("cannot create checkpoint folder " + dir.string() + ": " + ec.message());
  // A run killed while writing left its temporary file (core::write_file_atomic's name): space
  // that the next write may need.
  const std::string stale = checkpoint_file(dir).filename().string() + ".tmp.";
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(stale, 0) == 0) fs::remove(e.path(), ec);
  Writer w;
  w.add_model(layout, st.model);
  for (size_t k = 0; k < st.moments.size(); ++k)
    for (const Slot& s : slots(layout))
      if (s.kind == Slot::param) w.add_param(kMomentNames[k] + s.name, s, layout, st.moments[k]);
  w.add("optimizer.steps", core::DType::i32, {}, &st.optimizer_steps, 4);
  if (st.scaler) {
    w.add("scaler.scale", core::DType::f32, {}, &st.scaler->scale, 4);
    w.add("scaler.growth_tracker", core::DType::i32, {}, &st.scaler->growth_tracker, 4);
    w.add("scaler.skipped_steps", core::DType::i32, {}, &st.scaler->skipped_steps, 4);
  }
  std::map<std::string, std::string> meta{{"format", "pt"}, {"gpulab", kFormat}, {"step", std::to_string(st.step)}};
  for (const auto& [k, v] : st.recipe) meta["recipe." + k] = v;
  core::write_safetensors(checkpoint_file(dir), w.tensors, meta);
}

TrainState read_checkpoint(const fs::path& dir, const ResNetLayout& layout, int moment_count) {
  const fs::path path = checkpoint_file(dir);
  if (!fs::exists(path)) throw core::InputError(dir.string() + ": no checkpoint.safetensors to resume from");
  const core::SafetensorsFile f(path);
  const auto& meta = f.metadata();
  const auto format = meta.find("gpulab");
  if (format == meta.end() || format->second != kFormat)
    throw core::InputError(path.string() + ": not a gpulab training checkpoint (no '" + std::string(kFormat) +
                           "' in its metadata)");
  TrainState st;
  if (!parse_count(meta, "step", &st.step))
    throw core::InputError(path.string() + ": metadata has no valid 'step' (a count of steps done)");
  for (const auto& [k, v] : meta)
    if (k.rfind("recipe.", 0) == 0) st.recipe[k.substr(7)] = v;
  st.model = read_model(f, layout, "");
  // LAMB's second moment (k = 1) is a variance.
  for (int k = 0; k < moment_count; ++k)
    st.moments.push_back(read_params_as(f, layout, kMomentNames[k], k == 1 ? Values::non_negative : Values::finite));
  st.optimizer_steps = int32_t(*read_integer(f, "optimizer.steps", true));
  if (const auto scale = read_floats(f, "scaler.scale", {}, layout, false)) {
    if (!((*scale)[0] > 0))
      throw core::InputError(path.string() + ": 'scaler.scale' is " + value_text((*scale)[0]) + ", not positive");
    st.scaler = LossScaleState{(*scale)[0], int32_t(*read_integer(f, "scaler.growth_tracker", true)), 0,
                               int32_t(*read_integer(f, "scaler.skipped_steps", true))};
  }
  return st;
}

void check_same_recipe(const fs::path& dir, const std::map<std::string, std::string>& saved,
                       const std::map<std::string, std::string>& now) {
  for (const auto& [k, v] : now) {
    const auto it = saved.find(k);
    const std::string was = it == saved.end() ? "(not recorded)" : it->second;
    if (was != v)
      throw core::InputError(checkpoint_file(dir).string() + " was written with " + k + " = " + was + ", this run has " +
                             v + ": resume with the same options");
  }
}

ModelState download_model(ResNet& net, cudaStream_t stream) {
  ModelState m;
  m.params.resize(size_t(net.param_count()));
  GPULAB_CHECK(cudaMemcpyAsync(m.params.data(), net.params(), m.params.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  const std::vector<RunningStats> stats = net.running_stats();
  int64_t n = 0;
  for (const auto& s : stats) n += s.channels;
  m.running_mean.resize(size_t(n));
  m.running_var.resize(size_t(n));
  int64_t off = 0;
  for (const auto& s : stats) {
    GPULAB_CHECK(cudaMemcpyAsync(m.running_mean.data() + off, s.mean, size_t(s.channels) * 4, cudaMemcpyDeviceToHost, stream));
    GPULAB_CHECK(cudaMemcpyAsync(m.running_var.data() + off, s.var, size_t(s.channels) * 4, cudaMemcpyDeviceToHost, stream));
    off += s.channels;
  }
  GPULAB_CHECK(cudaStreamSynchronize(stream));
  m.batches_tracked = net.batches_tracked();
  return m;
}

void upload_model(ResNet& net, const ModelState& m, cudaStream_t stream) {
  if (int64_t(m.params.size()) != net.param_count()) throw core::Error("upload_model: parameter count differs");
  GPULAB_CHECK(cudaMemcpyAsync(net.params(), m.params.data(), m.params.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  int64_t off = 0;
  for (const auto& s : net.running_stats()) {
    GPULAB_CHECK(cudaMemcpyAsync(s.mean, m.running_mean.data() + off, size_t(s.channels) * 4, cudaMemcpyHostToDevice, stream));
    GPULAB_CHECK(cudaMemcpyAsync(s.var, m.running_var.data() + off, size_t(s.channels) * 4, cudaMemcpyHostToDevice, stream));
    off += s.channels;
  }
  net.sync_working_copy(stream);  // the same rounding as the optimizer's writes
  GPULAB_CHECK(cudaStreamSynchronize(stream));  // the sources are host memory the caller may free
  net.set_batches_tracked(m.batches_tracked);
}

TrainState capture_training(ResNet& net, const Optimizer& optimizer, const LossScaler* scaler, cudaStream_t stream) {
  TrainState st;
  st.model = download_model(net, stream);
  for (int k = 0; k < optimizer.moment_count(); ++k) st.moments.push_back(optimizer.read_moment(k, stream));
  st.optimizer_steps = optimizer.steps_taken(stream);
  if (scaler) st.scaler = scaler->read(stream);
  return st;
}

void restore_training(const TrainState& st, ResNet& net, Optimizer& optimizer, LossScaler* scaler, cudaStream_t stream) {
  upload_model(net, st.model, stream);
  optimizer.load_state(st.moments, st.optimizer_steps, stream);
  if (scaler) {
    if (!st.scaler) throw core::InputError("the checkpoint has no loss scaler state (not an fp16 run)");
    scaler->load(*st.scaler, stream);
  }
}

}  // namespace gpulab::train
