// The CPU augmentation (augment.h) as one CUDA kernel over a batch of decoded images: PIL's
// antialiased bilinear resize of a region, horizontal flip, normalize, NHWC in spec.out's type.
// Same taps, weights and accumulation order as resized_crop(), so the GPU pipeline's output
// matches the CPU pipeline's within float rounding when both start from the same pixels.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
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

// PIL's bilinear taps for output coordinate `o` of a 1-D resize in -> out, as bilinear_taps() in
// augment.cpp: the support widens with the scale when shrinking (antialiasing).
struct ResizeTaps {
  double center, filter_scale, sum;
  int lo, hi;
  __host__ __device__ ResizeTaps(int o, int in_size, int out_size) {
    const double scale = double(in_size) / out_size;
    filter_scale = scale > 1.0 ? scale : 1.0;
    center = (o + 0.5) * scale;
    lo = int(center - filter_scale + 0.5);
    lo = lo < 0 ? 0 : lo;
    hi = int(center + filter_scale + 0.5);
    hi = hi > in_size ? in_size : hi;
    sum = 0;
    for (int x = lo; x < hi; ++x) sum += raw(x);
  }
  __host__ __device__ double raw(int x) const {
    const double d = 1.0 - fabs((x - center + 0.5) / filter_scale);
    return d > 0 ? d : 0;
  }
  __host__ __device__ float weight(int x) const { return float(sum != 0 ? raw(x) / sum : 0.0); }
};

// Output pixel (x, y) of `job` as RGB in [0, 255]: horizontal then vertical pass in float, the
// order of resized_crop(). The kernel's body, callable on the host for tests.
__host__ __device__ inline void resize_pixel(const ResizeJob& j, int size, int x, int y, float rgb[3]) {
  const ResizeTaps tx(j.left + (j.flip ? size - 1 - x : x), j.box.width, j.resize_w);
  const ResizeTaps ty(j.top + y, j.box.height, j.resize_h);
  float acc[3] = {0, 0, 0};
  for (int yy = ty.lo; yy < ty.hi; ++yy) {
    const uint8_t* row = j.src + (size_t(j.box.top + yy) * j.src_w + j.box.left) * 3;
    float h[3] = {0, 0, 0};
    for (int xx = tx.lo; xx < tx.hi; ++xx) {
      const float w = tx.weight(xx);
      for (int c = 0; c < 3; ++c) h[c] += w * row[xx * 3 + c];
    }
    const float w = ty.weight(yy);
    for (int c = 0; c < 3; ++c) acc[c] += w * h[c];
  }
  for (int c = 0; c < 3; ++c) rgb[c] = acc[c] < 0.f ? 0.f : acc[c] > 255.f ? 255.f : acc[c];
}

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
