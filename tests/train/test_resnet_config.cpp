// ResNet layouts: parameter counts equal torchvision's, v1.5 stride placement, init statistics.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "train/resnet_config.h"

using namespace gpulab::train;

TEST(ResNetConfig, ParameterCountsMatchTorchvision) {
  // sum(p.numel() for p in torchvision.models.resnetN().parameters())
  const std::pair<int, int64_t> expected[] = {
      {18, 11689512}, {34, 21797672}, {50, 25557032}, {101, 44549160}, {152, 60192808}};
  for (const auto& [depth, count] : expected)
    EXPECT_EQ(resnet_param_count(resnet_layout({depth, 1000, 64, false})), count) << "depth " << depth;
}

TEST(ResNetConfig, Resnet50IsV15WithTorchvisionNames) {
  const ResNetLayout l = resnet_layout({50, 1000, 64, false});
  EXPECT_EQ(l.blocks.size(), 16u);
  EXPECT_EQ(l.features, 2048);
  // layer2.0: conv1 1x1 stride 1, conv2 3x3 stride 2 (v1.5), downsample 1x1 stride 2.
  const BlockSpec& b = l.blocks[3];
  EXPECT_EQ(l.convs[b.convs[0]].name, "layer2.0.conv1");
  EXPECT_EQ(l.convs[b.convs[0]].stride, 1);
  EXPECT_EQ(l.convs[b.convs[1]].stride, 2);
  EXPECT_EQ(l.convs[b.convs[1]].kernel, 3);
  EXPECT_EQ(l.convs[b.convs[1]].pad, 1);
  EXPECT_FALSE(l.convs[b.convs[2]].relu);
  ASSERT_GE(b.shortcut, 0);
  EXPECT_EQ(l.convs[b.shortcut].name, "layer2.0.downsample.0");
  EXPECT_EQ(l.convs[b.shortcut].bn_name, "layer2.0.downsample.1");
  EXPECT_EQ(l.convs[b.shortcut].stride, 2);
  EXPECT_EQ(l.blocks[4].shortcut, -1);
  const auto params = resnet_params(l);
  EXPECT_EQ(params.front().name, "conv1.weight");
  EXPECT_EQ(params[1].name, "bn1.weight");
  EXPECT_FALSE(params[1].decay);
  EXPECT_EQ(params.back().name, "fc.bias");
  EXPECT_EQ(params[params.size() - 2].count, 2048 * 1000);
  EXPECT_THROW(resnet_layout({20, 10, 64, false}), gpulab::core::InputError);
}

// A narrower ResNet (--width) has the same layers, names and strides, each conv's channels scaled;
// the GPU model takes multiples of 8.
TEST(ResNetConfig, WidthScalesEveryConvAndTheGpuTakesMultiplesOfEight) {
  const ResNetLayout wide = resnet_layout({18, 10, 64, false}), narrow = resnet_layout({18, 10, 16, false});
  ASSERT_EQ(narrow.convs.size(), wide.convs.size());
  for (size_t i = 1; i < wide.convs.size(); ++i) {  // conv1 takes the image's 3 channels in either
    EXPECT_EQ(narrow.convs[i].name, wide.convs[i].name);
    EXPECT_EQ(narrow.convs[i].stride, wide.convs[i].stride);
    EXPECT_EQ(4 * narrow.convs[i].in, wide.convs[i].in) << wide.convs[i].name;
    EXPECT_EQ(4 * narrow.convs[i].out, wide.convs[i].out) << wide.convs[i].name;
  }
  EXPECT_EQ(4 * narrow.features, wide.features);
  for (int width : {0, 4, 12, -8}) EXPECT_THROW(check_gpu_width(width), gpulab::core::InputError) << width;
  for (int width : {8, 16, 64}) EXPECT_NO_THROW(check_gpu_width(width)) << width;
  EXPECT_THROW(resnet_layout({18, 10, 0, false}), gpulab::core::InputError);
}

TEST(ResNetConfig, InitFollowsTorchvision) {
  const ResNetLayout l = resnet_layout({18, 10, 64, true});
  const auto params = resnet_params(l);
  const auto w = resnet_init(l, 5);
  ASSERT_EQ(int64_t(w.size()), resnet_param_count(l));
  EXPECT_EQ(w, resnet_init(l, 5));
  EXPECT_NE(w, resnet_init(l, 6));
  size_t off = 0;
  for (const auto& p : params) {
    const float* v = &w[off];
    off += size_t(p.count);
    double mean = 0, sq = 0, lo = 1e9, hi = -1e9;
    for (int64_t i = 0; i < p.count; ++i) {
      mean += v[i];
      sq += double(v[i]) * v[i];
      lo = std::min(lo, double(v[i]));
      hi = std::max(hi, double(v[i]));
    }
    mean /= double(p.count);
    const double sd = std::sqrt(sq / double(p.count) - mean * mean);
    if (p.name == "layer1.0.conv1.weight") {  // 64x3x3x64: fan_out 576, std sqrt(2/576)
      EXPECT_NEAR(sd, std::sqrt(2.0 / 576), 0.02 * std::sqrt(2.0 / 576));
      EXPECT_NEAR(mean, 0, 0.003);
    } else if (p.name == "layer1.0.bn2.weight") {  // zero_init_residual
      EXPECT_EQ(hi, 0);
      EXPECT_EQ(lo, 0);
    } else if (p.name == "bn1.weight") {
      EXPECT_EQ(lo, 1);
      EXPECT_EQ(hi, 1);
    } else if (p.name == "layer4.1.bn2.bias") {
      EXPECT_EQ(lo, 0);
      EXPECT_EQ(hi, 0);
    } else if (p.name == "fc.weight") {  // uniform(+-1/sqrt(512))
      EXPECT_LE(hi, 1 / std::sqrt(512.0));
      EXPECT_GE(lo, -1 / std::sqrt(512.0));
      EXPECT_NEAR(sd, 1 / std::sqrt(512.0) / std::sqrt(3.0), 0.1 / std::sqrt(512.0));
    }
  }
}
