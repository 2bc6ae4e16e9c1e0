// What the CPU and GPU loaders share so that, for one seed, they visit the same images in the
// same order and draw the same crops and flips: epoch order, per-sample generators, batch count,
// and where a corrupt file's replacement comes from.
#pragma once

#include <cstdint>
#include <vector>

#include "data/augment.h"
#include "data/rng.h"

namespace gpulab::data {

// Sample indices of one epoch: a seeded Fisher-Yates shuffle when `train`, else file order.
std::vector<int64_t> epoch_order(int64_t samples, uint64_t seed, int64_t epoch, bool train);

// The generator of the sample at `position` (counted from the epoch's start) of `epoch`. A corrupt
// file's replacement (the next file of the order) is augmented with the same generator.
Rng augment_rng(uint64_t seed, int64_t epoch, int64_t position);

// train: full batches only (at least one); eval: every image once, the last batch wrapped.
int64_t batches_per_epoch(int64_t samples, int batch, bool train);

// The crop and flip of one training sample, drawn as augment_train draws them.
struct TrainDraw {
  CropBox box;
  bool flip = false;
};
TrainDraw draw_train(int width, int height, Rng& rng, const AugmentSpec& spec);

// The eval transform as one resize then a window: resize the whole image to resize_w x
// resize_h, then take spec.size x spec.size at (top, left).
struct EvalGeometry {
  int resize_w = 0, resize_h = 0, top = 0, left = 0;
};
EvalGeometry eval_geometry(int width, int height, int size);

}  // namespace gpulab::data
