#include "train/resnet_config.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "data/rng.h"

namespace gpulab::train {

void check_gpu_width(int width) {
  if (width < 8 || width % 8)
    throw core::InputError("ResNet width " + std::to_string(width) + " is not a positive multiple of 8 (64 is ResNet's)");
}

ResNetLayout resnet_layout(const ResNetConfig& cfg) {
  std::vector<int> blocks;
  bool bottleneck = true;
  switch (cfg.depth) {
    case 18: blocks = {2, 2, 2, 2}, bottleneck = false; break;
    case 34: blocks = {3, 4, 6, 3}, bottleneck = false; break;
    case 50: blocks = {3, 4, 6, 3}; break;
    case 101: blocks = {3, 4, 23, 3}; break;
    case 152: blocks = {3, 8, 36, 3}; break;
    default: throw core::InputError("ResNet depth " + std::to_string(cfg.depth) + " is not one of 18, 34, 50, 101, 152");
  }
  if (cfg.classes < 1 || cfg.width < 1) throw core::InputError("ResNet needs at least one class and channel");
  ResNetLayout l;
  l.classes = cfg.classes;
  auto add = [&](std::string name, std::string bn, int in, int out, int k, int stride, bool relu, bool zero) {
    l.convs.push_back({std::move(name), std::move(bn), in, out, k, stride, k / 2, relu, zero});
    return int(l.convs.size() - 1);
  };
  add("conv1", "bn1", 3, cfg.width, 7, 2, true, false);
  const int expansion = bottleneck ? 4 : 1;
  int in = cfg.width;
  for (int stage = 0; stage < 4; ++stage) {
    const int planes = cfg.width << stage;
    for (int b = 0; b < blocks[stage]; ++b) {
      const int stride = b == 0 && stage > 0 ? 2 : 1;
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(b) + ".";
      const bool z = cfg.zero_init_residual;
      BlockSpec blk;
      if (bottleneck) {  // v1.5: the stride sits in the 3x3 conv
        blk.convs = {add(p + "conv1", p + "bn1", in, planes, 1, 1, true, false),
                     add(p + "conv2", p + "bn2", planes, planes, 3, stride, true, false),
                     add(p + "conv3", p + "bn3", planes, planes * 4, 1, 1, false, z)};
      } else {
        blk.convs = {add(p + "conv1", p + "bn1", in, planes, 3, stride, true, false),
                     add(p + "conv2", p + "bn2", planes, planes, 3, 1, false, z)};
      }
      if (stride != 1 || in != planes * expansion)
        blk.shortcut = add(p + "downsample.0", p + "downsample.1", in, planes * expansion, 1, stride, false, false);
      l.blocks.push_back(blk);
      in = planes * expansion;
    }
  }
  l.features = in;
  return l;
}

std::vector<ParamSpec> resnet_params(const ResNetLayout& layout) {
  std::vector<ParamSpec> out;
  // torchvision order: conv1, bn1, then per block conv1 bn1 conv2 bn2 [conv3 bn3] downsample, fc.
  for (const auto& c : layout.convs) {
    out.push_back({c.name + ".weight", int64_t(c.out) * c.in * c.kernel * c.kernel, true});
    out.push_back({c.bn_name + ".weight", c.out, false});
    out.push_back({c.bn_name + ".bias", c.out, false});
  }
  out.push_back({"fc.weight", int64_t(layout.classes) * layout.features, true});
  out.push_back({"fc.bias", layout.classes, false});
  return out;
}

int64_t resnet_param_count(const ResNetLayout& layout) {
  int64_t n = 0;
  for (const auto& p : resnet_params(layout)) n += p.count;
  return n;
}

int64_t resnet_stat_count(const ResNetLayout& layout) {
  int64_t n = 0;
  for (const auto& c : layout.convs) n += c.out;
  return n;
}

std::vector<int> resnet_backward_order(const ResNetLayout& layout) {
  const int fc = 3 * int(layout.convs.size());
  std::vector<int> order = {fc, fc + 1};
  auto conv = [&](int c) {
    for (int k = 0; k < 3; ++k) order.push_back(3 * c + k);
  };
  for (auto b = layout.blocks.rbegin(); b != layout.blocks.rend(); ++b) {
    for (auto c = b->convs.rbegin(); c != b->convs.rend(); ++c) conv(*c);
    if (b->shortcut >= 0) conv(b->shortcut);
  }
  conv(0);
  return order;
}

std::vector<float> resnet_init(const ResNetLayout& layout, uint64_t seed) {
  std::vector<float> out;
  out.reserve(size_t(resnet_param_count(layout)));
  data::Rng rng(seed);
  auto normal = [&] {  // Box-Muller on our own generator, for the same weights everywhere
    const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  };
  for (const auto& c : layout.convs) {
    const double std_dev = std::sqrt(2.0 / (double(c.out) * c.kernel * c.kernel));  // fan_out, gain sqrt(2)
    for (int64_t i = 0, n = int64_t(c.out) * c.in * c.kernel * c.kernel; i < n; ++i) out.push_back(float(std_dev * normal()));
    out.insert(out.end(), size_t(c.out), c.zero_gamma ? 0.f : 1.f);
    out.insert(out.end(), size_t(c.out), 0.f);
  }
  const double bound = 1.0 / std::sqrt(double(layout.features));
  for (int64_t i = 0, n = int64_t(layout.classes) * layout.features + layout.classes; i < n; ++i)
    out.push_back(float(rng.uniform(-bound, bound)));
  return out;
}

}  // namespace gpulab::train
