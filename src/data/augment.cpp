#include "data/augment.h"

#include <algorithm>

#include "core/dtype_dispatch.h"
#include "data/sampling.h"

namespace gpulab::data {

namespace {

// One output coordinate's taps: input indices [first, first + weights.size()).
struct Taps {
  int first = 0;
  std::vector<float> weights;
};

// PIL's precompute_coeffs for the bilinear (triangle, support 1) filter over an input of
// `in_size` samples.
std::vector<Taps> bilinear_taps(int in_size, int out_size) {
  const double scale = double(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;
  std::vector<Taps> taps(out_size);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    const int lo = std::max(int(center - support + 0.5), 0);
    const int hi = std::min(int(center + support + 0.5), in_size);
    double sum = 0;
    std::vector<double> w(hi - lo);
    for (int x = lo; x < hi; ++x) {
      w[x - lo] = std::max(0.0, 1.0 - std::abs((x - center + 0.5) / filter_scale));
      sum += w[x - lo];
    }
    taps[o].first = lo;
    for (double v : w) taps[o].weights.push_back(float(sum != 0 ? v / sum : 0));
  }
  return taps;
}

}  // namespace

std::vector<float> resized_crop(const Image& src, CropBox box, int out_w, int out_h) {
  if (box.width <= 0 || box.height <= 0 || box.left < 0 || box.top < 0 || box.left + box.width > src.width ||
      box.top + box.height > src.height)
    throw core::Error("resized_crop: box outside the image");
  const auto xt = bilinear_taps(box.width, out_w);
  const auto yt = bilinear_taps(box.height, out_h);
  // Horizontal pass over the crop's rows, then vertical, as PIL does.
  std::vector<float> tmp(size_t(box.height) * out_w * 3);
  for (int y = 0; y < box.height; ++y) {
    const uint8_t* row = &src.rgb[(size_t(box.top + y) * src.width + box.left) * 3];
    for (int x = 0; x < out_w; ++x) {
      float acc[3] = {0, 0, 0};
      for (size_t k = 0; k < xt[x].weights.size(); ++k) {
        const uint8_t* px = row + size_t(xt[x].first + k) * 3;
        for (int c = 0; c < 3; ++c) acc[c] += xt[x].weights[k] * px[c];
      }
      for (int c = 0; c < 3; ++c) tmp[(size_t(y) * out_w + x) * 3 + c] = acc[c];
    }
  }
  std::vector<float> out(size_t(out_h) * out_w * 3);
  for (int y = 0; y < out_h; ++y) {
    for (int x = 0; x < out_w; ++x) {
      float acc[3] = {0, 0, 0};
      for (size_t k = 0; k < yt[y].weights.size(); ++k) {
        const float* px = &tmp[(size_t(yt[y].first + k) * out_w + x) * 3];
        for (int c = 0; c < 3; ++c) acc[c] += yt[y].weights[k] * px[c];
      }
      for (int c = 0; c < 3; ++c) out[(size_t(y) * out_w + x) * 3 + c] = std::clamp(acc[c], 0.f, 255.f);
    }
  }
  return out;
}

void normalize_into(const std::vector<float>& hwc, int width, int height, bool flip, const AugmentSpec& spec,
                    void* out) {
  core::dispatch_activation(spec.out, [&]<class T>() {
    T* dst = static_cast<T*>(out);
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x) {
        const float* px = &hwc[(size_t(y) * width + (flip ? width - 1 - x : x)) * 3];
        for (int c = 0; c < 3; ++c)
          dst[(size_t(y) * width + x) * 3 + c] = T((px[c] / 255.f - spec.mean[c]) / spec.std[c]);
      }
  });
}

void augment_train(const Image& src, Rng& rng, const AugmentSpec& spec, void* out) {
  const TrainDraw d = draw_train(src.width, src.height, rng, spec);
  normalize_into(resized_crop(src, d.box, spec.size, spec.size), spec.size, spec.size, d.flip, spec, out);
}

void augment_eval(const Image& src, const AugmentSpec& spec, void* out) {
  const EvalGeometry g = eval_geometry(src.width, src.height, spec.size);
  const std::vector<float> resized = resized_crop(src, {0, 0, src.height, src.width}, g.resize_w, g.resize_h);
  std::vector<float> crop(size_t(spec.size) * spec.size * 3);
  for (int y = 0; y < spec.size; ++y)
    std::copy_n(&resized[(size_t(g.top + y) * g.resize_w + g.left) * 3], size_t(spec.size) * 3,
                &crop[size_t(y) * spec.size * 3]);
  normalize_into(crop, spec.size, spec.size, false, spec, out);
}

}  // namespace gpulab::data
