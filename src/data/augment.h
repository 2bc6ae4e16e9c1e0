// The CPU image augmentation of the ResNet-50 reference recipe, per torchvision:
//   train: RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip(0.5)
//          + ToTensor + Normalize(ImageNet mean/std)
//   eval:  Resize(size * 256/224, shorter side) + CenterCrop(size) + ToTensor + Normalize
// Output is NHWC (one image: HWC, channels RGB) in fp32, fp16 or bf16.
#pragma once

#include <array>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "data/jpeg.h"
#include "data/rng.h"

namespace gpulab::data {

// torchvision's (i, j, h, w): top row, left column, height, width.
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox&) const = default;
};

struct RandomResizedCropSpec {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
};

// torchvision RandomResizedCrop.get_params: 10 tries of (area fraction, log-uniform aspect
// ratio); the first box that fits wins, else a center crop clamped to the ratio range.
// `rng` needs uniform(lo, hi) and randint(lo, hi_exclusive); tests pass a scripted one.
// Python's round() is half-to-even, hence nearbyint.
template <class R>
CropBox random_resized_crop_box(int width, int height, R& rng, const RandomResizedCropSpec& spec = {}) {
  const double area = double(width) * height;
  const double log_lo = std::log(spec.ratio_min), log_hi = std::log(spec.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(spec.scale_min, spec.scale_max);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int w = int(std::nearbyint(std::sqrt(target_area * aspect)));
    const int h = int(std::nearbyint(std::sqrt(target_area / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int top = int(rng.randint(0, height - h + 1));
      const int left = int(rng.randint(0, width - w + 1));
      return {top, left, h, w};
    }
  }
  const double in_ratio = double(width) / height;
  int w = width, h = height;
  if (in_ratio < spec.ratio_min) {
    h = int(std::nearbyint(w / spec.ratio_min));
  } else if (in_ratio > spec.ratio_max) {
    w = int(std::nearbyint(h * spec.ratio_max));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

// Crops `box` and resizes it to out_w x out_h with PIL's bilinear filter (a triangle kernel
// widened by the scale when shrinking, i.e. antialiased), as torchvision's resized_crop.
// Computed in float without PIL's 8-bit rounding between the two passes. Returns HWC floats
// in [0, 255].
std::vector<float> resized_crop(const Image& src, CropBox box, int out_w, int out_h);

struct AugmentSpec {
  int size = 224;
  RandomResizedCropSpec crop;
  bool flip = true;
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
  core::DType out = core::DType::f32;  // f32, f16 or bf16
};

// Writes size*size*3 elements of spec.out at `out`. Draws the crop, then the flip, from `rng`.
void augment_train(const Image& src, Rng& rng, const AugmentSpec& spec, void* out);
void augment_eval(const Image& src, const AugmentSpec& spec, void* out);

// HWC [0,255] floats -> normalized, optionally mirrored, in spec.out's type.
void normalize_into(const std::vector<float>& hwc, int width, int height, bool flip, const AugmentSpec& spec,
                    void* out);

}  // namespace gpulab::data
