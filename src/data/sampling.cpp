#include "data/sampling.h"

#include <algorithm>
#include <cmath>

namespace gpulab::data {

namespace {
constexpr uint64_t kOrderStream = 0x5EED0000;    // Rng streams: epoch order ...
constexpr uint64_t kAugmentStream = 0xA0600000;  // ... and per-sample augmentation
}  // namespace

std::vector<int64_t> epoch_order(int64_t samples, uint64_t seed, int64_t epoch, bool train) {
  std::vector<int64_t> perm(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) perm[size_t(i)] = i;
  if (train) {  // Fisher-Yates with our own generator: the same order on every platform
    Rng rng = Rng::for_item(seed, kOrderStream, uint64_t(epoch));
    for (int64_t i = samples - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng.randint(0, i + 1))]);
  }
  return perm;
}

Rng augment_rng(uint64_t seed, int64_t epoch, int64_t position) {
  return Rng::for_item(seed, kAugmentStream + uint64_t(epoch), uint64_t(position));
}

int64_t batches_per_epoch(int64_t samples, int batch, bool train) {
  return train ? std::max<int64_t>(1, samples / batch) : (samples + batch - 1) / batch;
}

TrainDraw draw_train(int width, int height, Rng& rng, const AugmentSpec& spec) {
  TrainDraw d;
  d.box = random_resized_crop_box(width, height, rng, spec.crop);
  d.flip = spec.flip && rng.uniform() < 0.5;
  return d;
}

EvalGeometry eval_geometry(int width, int height, int size) {
  // Resize(size * 256 / 224): shorter side to that, longer side int(short * long / short).
  const int resize = size * 256 / 224;
  const bool wide = width >= height;
  const int shorter = wide ? height : width, longer = wide ? width : height;
  const int new_long = int(int64_t(resize) * longer / shorter);
  EvalGeometry g;
  g.resize_w = wide ? new_long : resize;
  g.resize_h = wide ? resize : new_long;
  // CenterCrop: offsets int(round((in - out) / 2)), half to even as Python.
  g.top = int(std::nearbyint((g.resize_h - size) / 2.0));
  g.left = int(std::nearbyint((g.resize_w - size) / 2.0));
  return g;
}

}  // namespace gpulab::data
