// fp8 checkpoints (compressed-tensors / FBGEMM style): F8_E4M3 weights with per-tensor and
// per-channel `<name>_scale` tensors load, dequantize exactly to scale · value, stay close to the
// bf16 weights they came from, and give the CPU reference nearly the fixture's logits; broken
// scales are refused naming the tensor.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/safetensors.h"
#include "llm/cpu_model.h"
#include "llm/fixtures.h"
#include "llm/fp8_testing.h"
#include "llm/weights.h"

namespace gpulab::llm {
namespace {

using testing::Fp8ScaleLayout;

TEST(Fp8Checkpoint, PerTensorAndPerChannelScalesLoadAndDequantizeExactly) {
  const testing::ScratchDir dir("fp8_ckpt");
  testing::write_fp8_fixture(dir.path(), Fp8ScaleLayout::mixed);
  const WeightSource fp8 = WeightSource::from_checkpoint(dir.path());
  const WeightSource bf16 = WeightSource::from_checkpoint(testing::fixture_dir("llama_tiny"));
  int linear = 0;
  const core::Checkpoint original(testing::fixture_dir("llama_tiny"));
  for (const core::Checkpoint::Entry& e : original.tensors()) {
    const std::string& name = e.info->name;
    if (!is_linear_weight(name)) {
      EXPECT_FALSE(fp8.is_fp8(name)) << name;
      EXPECT_EQ(fp8.load_f32(name), bf16.load_f32(name)) << name;
      continue;
    }
    ++linear;
    ASSERT_TRUE(fp8.is_fp8(name)) << name;
    const std::vector<float> w = bf16.load_f32(name);
    const int64_t rows = e.info->shape[0], cols = static_cast<int64_t>(w.size()) / rows;
    const testing::Fp8Tensor want = testing::quantize_fixture_tensor(w, rows, name, Fp8ScaleLayout::mixed);
    const std::vector<float> scales = fp8.fp8_row_scales(name);
    ASSERT_EQ(scales, want.row_scales) << name;
    const auto bytes = fp8.fp8_bytes(name);
    ASSERT_EQ(std::vector<uint8_t>(bytes.begin(), bytes.end()), want.q) << name;
    if (name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos) {
      for (float s : scales) EXPECT_EQ(s, scales[0]) << name << ": a per-tensor scale repeated per row";
    }
    const std::vector<float> deq = fp8.load_f32(name);
    double num = 0, den = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      const float s = scales[i / cols];
      ASSERT_EQ(deq[i], s * core::f8e4m3_bits_to_float(want.q[i])) << name << " element " << i;
      ASSERT_LE(std::fabs(deq[i] - w[i]), std::max(std::ldexp(std::fabs(w[i]), -4), std::ldexp(s, -10)) * 1.000001f)
          << name << " element " << i;
      num += double(deq[i] - w[i]) * (deq[i] - w[i]);
      den += double(w[i]) * w[i];
    }
    EXPECT_LT(std::sqrt(num / den), 0.04) << name;
  }
  EXPECT_EQ(linear, 2 * 7);
}

// Weight-only fp8 (per-channel) in the float32 reference, against the fixture's float32
// logits. On this random-weight fixture e4m3's 3 mantissa bits move the logits by ~6 % and flip
// the top token at ~15 % of the positions, all of them fp8 near ties (see fp8_testing.h); the
// issue's 95 % top-1 bar holds only outside those.
TEST(Fp8Checkpoint, CpuReferenceOnFp8WeightsStaysNearTheFixture) {
  const testing::ScratchDir dir("fp8_ckpt");
  testing::write_fp8_fixture(dir.path(), Fp8ScaleLayout::per_channel);
  const CpuModel model(WeightSource::from_checkpoint(dir.path()));
  testing::Fp8Agreement a;
  for (const auto& c : testing::load_fixture_cases("llama_tiny")) {
    const std::vector<float> got = model.logits(c.ids);
    ASSERT_EQ(got.size(), c.logits.size());
    a.add(got, c.logits, 1024);
  }
  a.print("fp8 weights, float32 math, vs the fixture");
  EXPECT_TRUE(a.finite);
  EXPECT_LT(a.rel_l2(), 0.08);
  EXPECT_GE(double(a.agree) / a.rows, 0.8);
  EXPECT_GE(double(a.decided_agree) / a.decided, 0.95);
  EXPECT_LE(a.worst_flip, 0.125f) << "a flip outside an fp8 near tie";
}

// A copy of the mixed fp8 checkpoint with one tensor replaced or dropped.
class BrokenFp8Checkpoint : public ::testing::Test {
 protected:
  void rewrite(const std::string& drop, const std::vector<core::TensorToWrite>& add) {
    const testing::ScratchDir src("fp8_src");
    testing::write_fp8_fixture(src.path(), Fp8ScaleLayout::mixed);
    std::filesystem::copy_file(src.path() / "config.json", dir_.path() / "config.json",
                               std::filesystem::copy_options::overwrite_existing);
    const core::Checkpoint ckpt(src.path());
    std::vector<core::TensorToWrite> out;
    for (const auto& e : ckpt.tensors())
      if (e.info->name != drop) out.push_back({e.info->name, e.info->dtype, e.info->shape, ckpt.data(e)});
    out.insert(out.end(), add.begin(), add.end());
    core::write_safetensors(dir_.path() / "model.safetensors", out);
  }
  void expect_refused(const std::string& needle) {
    try {
      WeightSource::from_checkpoint(dir_.path());
      ADD_FAILURE() << "loaded";
    } catch (const core::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  testing::ScratchDir dir_{"fp8_broken"};
  const std::string scale_ = "model.layers.1.mlp.down_proj.weight_scale";
};

TEST_F(BrokenFp8Checkpoint, MissingScaleIsNamed) {
  rewrite(scale_, {});
  expect_refused("'" + scale_ + "'");
}

TEST_F(BrokenFp8Checkpoint, BlockScalesAreRefusedClearly) {
  const std::vector<float> s(4, 1.0f);
  rewrite(scale_, {{"model.layers.1.mlp.down_proj.weight_scale_inv", core::DType::f32, {1, 4},
                    std::span(reinterpret_cast<const uint8_t*>(s.data()), 16)}});
  expect_refused("weight_scale_inv is not supported");
}

TEST_F(BrokenFp8Checkpoint, WrongScaleShapeIsNamed) {
  const std::vector<float> s(7, 1.0f);  // down_proj has 128 rows
  rewrite(scale_, {{scale_, core::DType::f32, {7}, std::span(reinterpret_cast<const uint8_t*>(s.data()), 28)}});
  expect_refused("[128, 1] per output channel");
}

TEST_F(BrokenFp8Checkpoint, ScaleThatIsNotFiniteIsNamed) {
  for (const float bad : {INFINITY, -INFINITY, NAN}) {
    std::vector<float> s(128, 0.01f);  // per output channel
    s[77] = bad;
    rewrite(scale_, {{scale_, core::DType::f32, {128, 1}, std::span(reinterpret_cast<const uint8_t*>(s.data()), 512)}});
    expect_refused("'" + scale_ + "' holds");
    expect_refused("at index 77 (an fp8 scale must be finite)");
  }
}

}  // namespace
}  // namespace gpulab::llm
