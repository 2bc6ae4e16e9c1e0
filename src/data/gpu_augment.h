// The CPU augmentation (augment.h) as one CUDA kernel over a batch of decoded images: PIL's
// antialiased bilinear resize of a region, horizontal flip, normalize, NHWC in spec.out's type.
// Same taps, weights and accumulation order as resized_crop(), so the GPU pipeline's output
// matches the CPU pipeline's within float rounding when both start from the same pixels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "data/augment.h"
#include "data/sampling.h"

namespace gpulab::data {

// One output image: resize `box` of the source to resize_w x resize_h, then write the
// size x size window at (top, left) of that, mirrored when `flip`.
struct ResizeJob {
  const uint8_t* src = nullptr;  // device, packed RGB8, row pitch src_w * 3
  int src_w = 0, src_h = 0;
  CropBox box;
  int resize_w = 0, resize_h = 0;
  int top = 0, left = 0;
  int flip = 0;
};

// RandomResizedCrop + flip: the drawn box resized to size x size.
ResizeJob train_job(const uint8_t* src, int width, int height, const TrainDraw& draw, int size);
// Resize (shorter side size*256/224) + CenterCrop(size).
ResizeJob eval_job(const uint8_t* src, int width, int height, int size);

// Writes `count` images of spec.size^2 x 3 elements (NHWC) at `out` (device). `jobs` is a device
// array of `count` jobs. Throws InputError for a job whose box or window is outside its image.
void resized_crop_normalize(const ResizeJob* jobs, int count, const AugmentSpec& spec, void* out, cudaStream_t stream);

// Host-side check of one job, run before upload: the kernel trusts its jobs.
void check_job(const ResizeJob& job, int size);

}  // namespace gpulab::data
