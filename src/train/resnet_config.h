// ResNet-N v1.5 (the stride in the bottleneck's 3x3 conv, as torchvision and MLPerf) as a list
// of layers, without any GPU: the shapes, parameter names (torchvision's) and initialisation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpulab::train {

struct ResNetConfig {
  int depth = 50;  // 18, 34 (basic blocks), 50, 101, 152 (bottlenecks)
  int classes = 1000;
  int width = 64;  // channels of the stem and first stage
  bool zero_init_residual = false;  // torchvision's option: last BN of each block starts at gamma 0
};

// One convolution followed by BatchNorm. Weights are stored NHWC-filter order: [out][kh][kw][in].
struct ConvSpec {
  std::string name;  // "layer1.0.conv1" (its BN is "layer1.0.bn1")
  std::string bn_name;
  int in = 0, out = 0, kernel = 1, stride = 1, pad = 0;
  bool relu = true;  // ReLU right after the BN (false for a block's last conv and the shortcut)
  bool zero_gamma = false;
};

struct BlockSpec {
  std::vector<int> convs;  // indices into ResNetLayout::convs, main path in order
  int shortcut = -1;       // index of the downsample conv, or -1 for identity
};

struct ResNetLayout {
  std::vector<ConvSpec> convs;  // convs[0] is the 7x7 stem
  std::vector<BlockSpec> blocks;
  int features = 0;  // channels into the classifier
  int classes = 0;
};

// Throws core::InputError for a depth other than 18/34/50/101/152.
ResNetLayout resnet_layout(const ResNetConfig& cfg);

// The GPU model's activation kernels move 16 bytes (8 halfs) at a time over whole channel rows,
// so it takes a width (ResNetConfig::width) that is a positive multiple of 8; throws
// core::InputError for another. A layout alone takes any.
void check_gpu_width(int width);

// Every parameter tensor in torchvision's state_dict order (running stats excluded).
struct ParamSpec {
  std::string name;   // "layer1.0.conv1.weight"
  int64_t count = 0;
  bool decay = true;  // false for BN weight/bias and the FC bias
};
std::vector<ParamSpec> resnet_params(const ResNetLayout& layout);
int64_t resnet_param_count(const ResNetLayout& layout);
// Channels of every BatchNorm together: the length of the packed running mean and variance.
int64_t resnet_stat_count(const ResNetLayout& layout);

// The order in which ResNet::backward finishes each parameter's gradient (indices into
// resnet_params): fc weight and bias, then block by block from the last, each block's convs from
// the last and its shortcut after them, the stem last; a conv's weight, BN weight, BN bias.
std::vector<int> resnet_backward_order(const ResNetLayout& layout);

// torchvision's initialisation into `out` (resnet_params order, packed): conv weights
// kaiming_normal(fan_out, relu), BN gamma 1 (0 where zero_gamma) and beta 0, FC weight and bias
// uniform(+-1/sqrt(fan_in)). Seeded and the same on every platform.
std::vector<float> resnet_init(const ResNetLayout& layout, uint64_t seed);

}  // namespace gpulab::train
