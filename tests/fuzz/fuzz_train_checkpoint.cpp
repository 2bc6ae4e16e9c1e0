// A training checkpoint (`gpulab train --resume`) and a torchvision state dict (`--init-from`)
// whose safetensors header is arbitrary text, over the data of a real checkpoint of a narrow
// ResNet-18: names, shapes, dtypes, offsets and metadata are what varies, not the parts
// fuzz_safetensors already covers. Whatever loads has the layout's sizes and values a run can
// use: finite, variances non-negative, counts non-negative, a positive loss scale.
//
// The seeds in corpus/train_checkpoint/ are the headers of such checkpoints, and of the LAMB one
// edited so that each value check refuses something (bad_values_seeds). When the format changes,
// remake them: GPULAB_FUZZ_WRITE_SEEDS=tests/fuzz/corpus/train_checkpoint fuzz_train_checkpoint -runs=0
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "train/checkpoint.h"

using namespace gpulab;
namespace fs = std::filesystem;

namespace {

const train::ResNetLayout& layout() {
  static const train::ResNetLayout l = train::resnet_layout({18, 10, 2, false});
  return l;
}

// A state with every part a checkpoint can hold: two moments (LAMB) and a loss scaler.
train::TrainState full_state() {
  train::TrainState st;
  const size_t params = size_t(train::resnet_param_count(layout()));
  const size_t stats = size_t(train::resnet_stat_count(layout()));
  for (size_t i = 0; i < params; ++i) st.model.params.push_back(std::sin(float(i)));
  st.model.running_mean.assign(stats, 0.25f);
  st.model.running_var.assign(stats, 1.5f);
  st.model.batches_tracked = 100;
  st.moments = {st.model.params, std::vector<float>(params, 0.125f)};
  st.optimizer_steps = 99;
  st.scaler = train::LossScaleState{1024.f, 3, 0, 1};
  st.step = 100;
  st.recipe = {{"batch", "32"}, {"precision", "fp16"}};
  return st;
}

// A safetensors file split into its JSON header and its data section.
struct Parts {
  std::string header, data;
};
Parts parts_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian, as on every machine this runs on
  return {bytes.substr(8, n), bytes.substr(8 + n)};
}

// The data section that every input's header points into: the full state's, whose tensors come
// first in the same order as an export's and a one-moment checkpoint's.
const std::string& data_section() {
  static const std::string data = [] {
    const fs::path dir = fuzz::scratch_dir() / "full";
    train::write_checkpoint(dir, layout(), full_state());
    return parts_of(train::checkpoint_file(dir)).data;
  }();
  return data;
}

const fs::path& input_dir() {
  static const fs::path dir = [] {
    const fs::path d = fuzz::scratch_dir() / "input";
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

void check_model(const train::ModelState& m) {
  fuzz::check(int64_t(m.params.size()) == train::resnet_param_count(layout()), "every parameter is read");
  fuzz::check(int64_t(m.running_mean.size()) == train::resnet_stat_count(layout()) &&
                  m.running_var.size() == m.running_mean.size(),
              "every running statistic is read");
  for (float v : m.params) fuzz::check(std::isfinite(v), "parameters are finite");
  for (float v : m.running_mean) fuzz::check(std::isfinite(v), "running means are finite");
  for (float v : m.running_var) fuzz::check(std::isfinite(v) && v >= 0, "running variances are finite, not negative");
  fuzz::check(m.batches_tracked >= 0, "the batch count is not negative");
}

// The header of a full checkpoint edited so that its tensors point at values the reader must
// refuse, one kind each: the fuzzer cannot reach these checks by flipping bytes of a valid header
// (scripts/fuzz_coverage.sh showed them unreached). Offsets are swapped, never shared, which the
// safetensors reader would refuse first.
std::vector<std::pair<std::string, std::string>> bad_values_seeds(const std::string& header) {
  using nlohmann::json;
  const json base = json::parse(header);
  const auto swap = [](json& h, const std::string& a, const std::string& b) {
    std::swap(h[a]["data_offsets"], h[b]["data_offsets"]);
  };
  std::vector<std::pair<std::string, std::string>> seeds;
  json h = base;  // every running variance reads its layer's bias (sin values, some negative)
  for (const auto& [name, _] : base.items())
    if (name.ends_with(".running_var")) swap(h, name, name.substr(0, name.size() - 11) + "bias");
  seeds.emplace_back("variances_from_biases", h.dump());
  h = base;  // the loss scale as bf16: the low half of 1024.0f, which is 0
  h["scaler.scale"]["dtype"] = "BF16";
  h["scaler.scale"]["data_offsets"][1] = h["scaler.scale"]["data_offsets"][0].get<uint64_t>() + 2;
  seeds.emplace_back("scale_reads_zero", h.dump());
  // A batch count reads a two-channel bias whose second value is negative: a negative int64.
  for (const auto& [name, t] : base.items()) {
    const auto offsets = t.is_object() ? t.value("data_offsets", json::array()) : json::array();
    if (!name.ends_with(".bias") || offsets.size() != 2 || offsets[1].get<uint64_t>() - offsets[0].get<uint64_t>() != 8)
      continue;
    float second;
    std::memcpy(&second, data_section().data() + offsets[0].get<uint64_t>() + 4, 4);
    if (second >= 0) continue;
    h = base;
    swap(h, name, name.substr(0, name.size() - 4) + "num_batches_tracked");
    seeds.emplace_back("negative_batch_count", h.dump());
    break;
  }
  h = base;  // weights stored as fp16 and bf16, in the first half of their fp32 spans
  for (const auto& [name, dtype] : {std::pair{"bn1.weight", "F16"}, std::pair{"layer1.0.bn1.weight", "BF16"}}) {
    json& t = h[name];
    const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    t["dtype"] = dtype;
    t["data_offsets"][1] = begin + (end - begin) / 2;
  }
  seeds.emplace_back("half_precision_weights", h.dump());
  h = base;  // the right bytes in the wrong shape
  h["bn1.weight"]["shape"] = {1, h["bn1.weight"]["shape"][0]};
  seeds.emplace_back("wrong_shape", h.dump());
  h = base;  // float bytes as integers
  h["bn1.running_mean"]["dtype"] = "I32";
  seeds.emplace_back("floats_as_integers", h.dump());
  h = base;
  h.erase("optimizer.steps");
  seeds.emplace_back("no_optimizer_steps", h.dump());
  h = base;
  h["scaler.growth_tracker"]["dtype"] = "F32";
  seeds.emplace_back("counter_as_float", h.dump());
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* seeds = std::getenv("GPULAB_FUZZ_WRITE_SEEDS");
  if (!seeds) return 0;
  const fs::path out(seeds), dir = fuzz::scratch_dir() / "seeds";
  fs::create_directories(out);
  train::TrainState st = full_state();
  train::write_checkpoint(dir, layout(), st);
  const std::string lamb = parts_of(train::checkpoint_file(dir)).header;
  fuzz::write_bytes(out / "lamb_fp16", lamb);
  for (const auto& [name, header] : bad_values_seeds(lamb)) fuzz::write_bytes(out / name, header);
  st.moments.pop_back();
  st.scaler.reset();
  train::write_checkpoint(dir, layout(), st);
  fuzz::write_bytes(out / "sgd_fp32", parts_of(train::checkpoint_file(dir)).header);
  train::write_torchvision(dir / "export.safetensors", layout(), st.model);
  fuzz::write_bytes(out / "torchvision_export", parts_of(dir / "export.safetensors").header);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& dir = input_dir();
  const fs::path file = train::checkpoint_file(dir);
  std::string bytes(8, '\0');
  const uint64_t header_bytes = size;
  std::memcpy(bytes.data(), &header_bytes, 8);
  bytes.append(fuzz::as_text(data, size));
  bytes.append(data_section());
  fuzz::write_bytes(file, bytes);

  for (int moments : {1, 2})
    fuzz::refuse_or_pass([&] {
      const train::TrainState st = train::read_checkpoint(dir, layout(), moments);
      check_model(st.model);
      fuzz::check(int(st.moments.size()) == moments, "every moment is read");
      for (const auto& m : st.moments) {
        fuzz::check(m.size() == st.model.params.size(), "a moment is parameter-shaped");
        for (float v : m) fuzz::check(std::isfinite(v), "moments are finite");
      }
      if (moments == 2)
        for (float v : st.moments[1]) fuzz::check(v >= 0, "LAMB's second moment is not negative");
      fuzz::check(st.step >= 0 && st.optimizer_steps >= 0, "step counts are not negative");
      if (st.scaler)
        fuzz::check(std::isfinite(st.scaler->scale) && st.scaler->scale > 0 && st.scaler->growth_tracker >= 0 &&
                        st.scaler->skipped_steps >= 0,
                    "the loss scaler's state is usable");
    });
  fuzz::refuse_or_pass([&] { check_model(train::read_torchvision(file, layout())); });
  return 0;
}
