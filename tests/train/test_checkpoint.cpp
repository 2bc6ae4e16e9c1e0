// Checkpoints and torchvision interchange without a GPU: names, shapes and order of the state
// dict, the OIHW conversion, bit-exact round trips, clear errors for bad files, and a write that
// fails on a full disk (a file-size limit) leaving the previous checkpoint intact.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/safetensors.h"
#include "train/checkpoint.h"
#include "train/train_test_util.h"

using namespace gpulab;
using namespace gpulab::train;
using fixtures::temp_dir;
namespace fs = std::filesystem;

namespace {

std::vector<float> random_floats(size_t n, std::mt19937& gen) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

ModelState random_model(const ResNetLayout& layout, uint32_t seed) {
  std::mt19937 gen(seed);
  ModelState m;
  m.params = random_floats(size_t(resnet_param_count(layout)), gen);
  const size_t stats = size_t(resnet_stat_count(layout));
  m.running_mean = random_floats(stats, gen);
  m.running_var = random_floats(stats, gen);
  for (float& v : m.running_var) v = std::abs(v);  // a variance
  m.batches_tracked = 1234567;
  return m;
}

TrainState random_state(const ResNetLayout& layout, int moments, uint32_t seed) {
  std::mt19937 gen(seed);
  TrainState s;
  s.model = random_model(layout, seed + 1);
  for (int k = 0; k < moments; ++k) {
    s.moments.push_back(random_floats(s.model.params.size(), gen));
    if (k == 1)
      for (float& v : s.moments.back()) v = std::abs(v);  // LAMB's second moment
  }
  s.optimizer_steps = 41;
  s.scaler = LossScaleState{32768.f, 17, 0, 3};
  s.step = 42;
  s.recipe = {{"batch", "256"}, {"precision", "fp16"}};
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same_model(const ModelState& a, const ModelState& b) {
  EXPECT_TRUE(same_bits(a.params, b.params));
  EXPECT_TRUE(same_bits(a.running_mean, b.running_mean));
  EXPECT_TRUE(same_bits(a.running_var, b.running_var));
  EXPECT_EQ(a.batches_tracked, b.batches_tracked);
}

// Runs `f`, expecting an InputError whose message holds every one of `parts`.
template <class F>
void expect_input_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Checkpoint, ConvWeightsTurnBetweenOhwiAndOihw) {
  std::mt19937 gen(1);
  const int out = 5, in = 3, k = 3;
  const std::vector<float> w = random_floats(size_t(out) * in * k * k, gen);
  const std::vector<float> t = ohwi_to_oihw(w.data(), out, in, k);
  for (int o = 0; o < out; ++o)
    for (int c = 0; c < in; ++c)
      for (int y = 0; y < k; ++y)
        for (int x = 0; x < k; ++x)
          ASSERT_EQ(t[((size_t(o) * in + c) * k + y) * k + x], w[((size_t(o) * k + y) * k + x) * in + c]);
  EXPECT_TRUE(same_bits(oihw_to_ohwi(t.data(), out, in, k), w));
}

TEST(Checkpoint, ExportHasTorchvisionStateDictNamesShapesAndOrder) {
  const fs::path dir = temp_dir("ckpt_export");
  for (const int depth : {18, 50}) {
    SCOPED_TRACE(depth);
    const ResNetLayout layout = resnet_layout({depth, 1000, 64, false});
    const ModelState m = random_model(layout, 7);
    const fs::path file = dir / "resnet.safetensors";
    write_torchvision(file, layout, m);
    const core::SafetensorsFile f(file);
    // torchvision's resnet18/resnet50 state_dict: 122 and 320 entries.
    EXPECT_EQ(f.tensors().size(), depth == 18 ? 122u : 320u);
    std::vector<core::TensorInfo> order = f.tensors();
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.data_begin < b.data_begin; });
    const std::vector<std::string> first = {"conv1.weight",      "bn1.weight",           "bn1.bias",
                                            "bn1.running_mean",  "bn1.running_var",      "bn1.num_batches_tracked",
                                            "layer1.0.conv1.weight"};
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(order[i].name, first[i]);
    EXPECT_EQ(order[order.size() - 2].name, "fc.weight");
    EXPECT_EQ(order.back().name, "fc.bias");
    EXPECT_EQ(f.find("conv1.weight")->shape, (std::vector<int64_t>{64, 3, 7, 7}));
    EXPECT_EQ(f.find("bn1.num_batches_tracked")->dtype, core::DType::i64);
    EXPECT_TRUE(f.find("bn1.num_batches_tracked")->shape.empty());
    if (depth == 50) {
      EXPECT_EQ(f.find("layer2.0.conv2.weight")->shape, (std::vector<int64_t>{128, 128, 3, 3}));
      EXPECT_EQ(f.find("layer2.0.downsample.0.weight")->shape, (std::vector<int64_t>{512, 256, 1, 1}));
      EXPECT_EQ(f.find("layer4.2.bn3.running_var")->shape, (std::vector<int64_t>{2048}));
      EXPECT_EQ(f.find("fc.weight")->shape, (std::vector<int64_t>{1000, 2048}));
    }
    // conv1.weight[o][c][y][x] is our params[o][y][x][c] (conv1 is the first parameter).
    const auto bytes = f.data(*f.find("conv1.weight"));
    const float* w = reinterpret_cast<const float*>(bytes.data());
    for (int o = 0; o < 64; ++o)
      for (int c = 0; c < 3; ++c)
        for (int y = 0; y < 7; ++y)
          for (int x = 0; x < 7; ++x)
            ASSERT_EQ(w[((o * 3 + c) * 7 + y) * 7 + x], m.params[size_t(((o * 7 + y) * 7 + x) * 3 + c)]);
    expect_same_model(read_torchvision(file, layout), m);
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, TorchvisionWeightsInHalfPrecisionAndWithoutBatchCountLoad) {
  const fs::path dir = temp_dir("ckpt_half");
  const ResNetLayout layout = resnet_layout({18, 10, 8, false});
  const ModelState m = random_model(layout, 3);
  write_torchvision(dir / "full.safetensors", layout, m);
  // Rewrite every float tensor as bf16 and drop num_batches_tracked, as some exports do.
  const core::SafetensorsFile full(dir / "full.safetensors");
  std::vector<std::vector<uint16_t>> keep;
  std::vector<core::TensorToWrite> tensors;
  keep.reserve(full.tensors().size());
  for (const auto& t : full.tensors()) {
    if (t.dtype != core::DType::f32) continue;
    const float* src = reinterpret_cast<const float*>(full.data(t).data());
    keep.emplace_back(t.numel());
    for (size_t i = 0; i < t.numel(); ++i) keep.back()[i] = core::float_to_bf16_bits(src[i]);
    tensors.push_back({t.name, core::DType::bf16, t.shape, {reinterpret_cast<const uint8_t*>(keep.back().data()), t.numel() * 2}});
  }
  core::write_safetensors(dir / "bf16.safetensors", tensors);
  const ModelState r = read_torchvision(dir / "bf16.safetensors", layout);
  ASSERT_EQ(r.params.size(), m.params.size());
  for (size_t i = 0; i < m.params.size(); ++i)
    ASSERT_EQ(r.params[i], core::bf16_bits_to_float(core::float_to_bf16_bits(m.params[i]))) << i;
  EXPECT_EQ(r.batches_tracked, 0);
  fs::remove_all(dir);
}

TEST(Checkpoint, RoundTripIsBitExact) {
  const fs::path dir = temp_dir("ckpt_roundtrip");
  const ResNetLayout layout = resnet_layout({50, 10, 8, false});
  for (const int moments : {1, 2}) {
    TrainState s = random_state(layout, moments, 11);
    if (moments == 1) s.scaler.reset();
    write_checkpoint(dir, layout, s);
    const TrainState r = read_checkpoint(dir, layout, moments);
    expect_same_model(r.model, s.model);
    ASSERT_EQ(r.moments.size(), size_t(moments));
    for (int k = 0; k < moments; ++k) EXPECT_TRUE(same_bits(r.moments[size_t(k)], s.moments[size_t(k)]));
    EXPECT_EQ(r.optimizer_steps, 41);
    EXPECT_EQ(r.step, 42);
    EXPECT_EQ(r.recipe, s.recipe);
    ASSERT_EQ(r.scaler.has_value(), moments == 2);
    if (r.scaler) {
      EXPECT_EQ(r.scaler->scale, 32768.f);
      EXPECT_EQ(r.scaler->growth_tracker, 17);
      EXPECT_EQ(r.scaler->skipped_steps, 3);
    }
    // A checkpoint is itself a torchvision state dict.
    expect_same_model(read_torchvision(checkpoint_file(dir), layout), s.model);
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, BadFilesGiveOneClearInputError) {
  const fs::path dir = temp_dir("ckpt_bad");
  const ResNetLayout r18 = resnet_layout({18, 10, 8, false});
  const ResNetLayout r34 = resnet_layout({34, 10, 8, false});
  const ResNetLayout r50 = resnet_layout({50, 10, 8, false});
  expect_input_error([&] { read_checkpoint(dir, r18, 1); }, {dir.string(), "no checkpoint.safetensors"});
  write_checkpoint(dir, r18, random_state(r18, 1, 5));
  const std::string file = checkpoint_file(dir).string();
  // Another depth: a missing block, or a conv of another shape.
  expect_input_error([&] { read_checkpoint(dir, r34, 1); }, {file, "no tensor 'layer1.2.conv1.weight'", "ResNet-34"});
  expect_input_error([&] { read_checkpoint(dir, r50, 1); }, {file, "'layer1.0.conv1.weight' has shape [8, 8, 3, 3]", "[8, 8, 1, 1]"});
  // Another class count.
  expect_input_error([&] { read_checkpoint(dir, resnet_layout({18, 12, 8, false}), 1); }, {file, "'fc.weight'", "--classes"});
  // LAMB state asked of an SGD checkpoint.
  expect_input_error([&] { read_checkpoint(dir, r18, 2); }, {file, "no tensor 'optimizer.v.conv1.weight'"});
  // An export is not a training checkpoint.
  write_torchvision(checkpoint_file(dir), r18, random_model(r18, 6));
  expect_input_error([&] { read_checkpoint(dir, r18, 1); }, {file, "not a gpulab training checkpoint"});
  // Truncated.
  write_checkpoint(dir, r18, random_state(r18, 1, 5));
  fs::resize_file(checkpoint_file(dir), fs::file_size(checkpoint_file(dir)) / 2);
  expect_input_error([&] { read_checkpoint(dir, r18, 1); }, {file, "truncated"});
  // A missing tensor.
  {
    write_torchvision(dir / "full.safetensors", r18, random_model(r18, 8));
    const core::SafetensorsFile full(dir / "full.safetensors");
    std::vector<core::TensorToWrite> tensors;
    for (const auto& t : full.tensors())
      if (t.name != "layer3.1.bn2.running_var") tensors.push_back({t.name, t.dtype, t.shape, full.data(t)});
    core::write_safetensors(dir / "missing.safetensors", tensors);
  }
  expect_input_error([&] { read_torchvision(dir / "missing.safetensors", r18); },
                     {"missing.safetensors", "no tensor 'layer3.1.bn2.running_var'"});
  expect_input_error([&] { read_torchvision(dir / "nothing.safetensors", r18); }, {"nothing.safetensors"});
  fs::remove_all(dir);
}

// Values that no run writes, each refused by name when read: the resumed run would otherwise
// train on NaN (a non-finite weight, a negative variance under a square root, a scale of 0) or
// start its loader and schedule at a negative step.
TEST(Checkpoint, ValuesNoRunWritesGiveOneClearInputError) {
  const fs::path dir = temp_dir("ckpt_values");
  const ResNetLayout r18 = resnet_layout({18, 10, 4, false});
  const std::string file = checkpoint_file(dir).string();
  auto refused = [&](const TrainState& st, int moments, std::initializer_list<std::string> parts) {
    write_checkpoint(dir, r18, st);
    expect_input_error([&] { read_checkpoint(dir, r18, moments); }, parts);
  };
  const TrainState good = random_state(r18, 2, 9);
  ASSERT_NO_THROW(write_checkpoint(dir, r18, good));
  ASSERT_NO_THROW(read_checkpoint(dir, r18, 2));

  TrainState st = good;
  st.model.params[5] = NAN;  // conv1.weight, stored permuted: some index of it
  refused(st, 2, {file, "'conv1.weight' holds nan"});
  st = good;
  st.model.params.back() = INFINITY;
  refused(st, 2, {file, "'fc.bias' holds inf at index 9"});
  st = good;
  st.model.running_var[0] = -0.5f;
  refused(st, 2, {file, "'bn1.running_var' holds -0.5", "not a finite variance"});
  st = good;
  st.moments[0].back() = NAN;
  refused(st, 2, {file, "'optimizer.m.fc.bias' holds nan"});
  st = good;
  st.moments[1].back() = -1.f;
  refused(st, 2, {file, "'optimizer.v.fc.bias' holds -1", "not a finite variance"});
  st = good;
  st.moments[0].back() = -1.f;  // a first moment may be negative
  write_checkpoint(dir, r18, st);
  EXPECT_NO_THROW(read_checkpoint(dir, r18, 2));
  st = good;
  st.scaler->scale = 0.f;
  refused(st, 2, {file, "'scaler.scale' is 0", "not positive"});
  st = good;
  st.scaler->skipped_steps = -2;
  refused(st, 2, {file, "'scaler.skipped_steps' is -2, outside [0, 2147483647]"});
  st = good;
  st.optimizer_steps = -1;
  refused(st, 2, {file, "'optimizer.steps' is -1"});
  st = good;
  st.model.batches_tracked = -7;
  refused(st, 2, {file, "'bn1.num_batches_tracked' is -7"});
  st = good;
  st.step = -3;
  refused(st, 2, {file, "no valid 'step'"});

  // The step as text: only a whole non-negative decimal number.
  for (const std::string step : {"", "12abc", "+4", " 4", "1e3", "99999999999999999999"}) {
    write_checkpoint(dir / "good", r18, good);
    const core::SafetensorsFile f(checkpoint_file(dir / "good"));
    std::vector<core::TensorToWrite> tensors;
    for (const auto& t : f.tensors()) tensors.push_back({t.name, t.dtype, t.shape, f.data(t)});
    auto meta = f.metadata();
    meta["step"] = step;
    core::write_safetensors(checkpoint_file(dir), tensors, meta);
    expect_input_error([&] { read_checkpoint(dir, r18, 2); }, {file, "no valid 'step'"});
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, RecipeMismatchNamesTheOption) {
  expect_input_error([] { check_same_recipe("/ck", {{"batch", "256"}, {"seed", "1"}}, {{"batch", "128"}, {"seed", "1"}}); },
                     {"/ck/checkpoint.safetensors", "batch = 256", "this run has 128"});
  EXPECT_NO_THROW(check_same_recipe("/ck", {{"batch", "256"}}, {{"batch", "256"}}));
}

// A disk that fills up mid-write: a file-size limit makes write() fail with EFBIG (SIGXFSZ
// ignored, as `gpulab train` does). The error names the file; the previous checkpoint stays.
TEST(Checkpoint, FailedWriteKeepsThePreviousCheckpoint) {
  const fs::path dir = temp_dir("ckpt_full");
  const ResNetLayout layout = resnet_layout({18, 10, 8, false});
  TrainState first = random_state(layout, 1, 21);
  write_checkpoint(dir, layout, first);
  const uintmax_t size = fs::file_size(checkpoint_file(dir));
  TrainState second = random_state(layout, 1, 22);
  second.step = 43;

  struct Limit {
    rlimit old{};
    void (*old_handler)(int);
    explicit Limit(rlim_t bytes) {
      old_handler = ::signal(SIGXFSZ, SIG_IGN);
      ::getrlimit(RLIMIT_FSIZE, &old);
      rlimit l = old;
      l.rlim_cur = bytes;
      ::setrlimit(RLIMIT_FSIZE, &l);
    }
    ~Limit() {
      ::setrlimit(RLIMIT_FSIZE, &old);
      ::signal(SIGXFSZ, old_handler);
    }
  };
  std::string message;
  {
    const Limit limit(size / 3);
    try {
      write_checkpoint(dir, layout, second);
    } catch (const core::Error& e) {
      message = e.what();
    }
  }
  EXPECT_NE(message.find(checkpoint_file(dir).string()), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
  const TrainState r = read_checkpoint(dir, layout, 1);
  EXPECT_EQ(r.step, 42);
  expect_same_model(r.model, first.model);
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1u);  // no temporary file left behind
  // And with space again, the next write goes through.
  write_checkpoint(dir, layout, second);
  EXPECT_EQ(read_checkpoint(dir, layout, 1).step, 43);
  fs::remove_all(dir);
}
