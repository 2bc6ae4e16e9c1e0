#include "data/gpu_augment.h"

#include "core/dtype_dispatch.h"
#include "core/error.h"

namespace gpulab::data {

namespace {

struct Normalize {
  float mean[3], std[3];
};

// PIL's bilinear taps for output coordinate `o` of a 1-D resize in -> out, as bilinear_taps() in
// augment.cpp: the support widens with the scale when shrinking (antialiasing).
struct Taps {
  double center, filter_scale;
  int lo, hi;
  double sum;
  __device__ Taps(int o, int in_size, int out_size) {
    const double scale = double(in_size) / out_size;
    filter_scale = fmax(scale, 1.0);
    center = (o + 0.5) * scale;
    lo = max(int(center - filter_scale + 0.5), 0);
    hi = min(int(center + filter_scale + 0.5), in_size);
    sum = 0;
    for (int x = lo; x < hi; ++x) sum += raw(x);
  }
  __device__ double raw(int x) const { return fmax(0.0, 1.0 - fabs((x - center + 0.5) / filter_scale)); }
  __device__ float weight(int x) const { return float(sum != 0 ? raw(x) / sum : 0.0); }
};

// One thread per output pixel; blockIdx.y is the image.
template <class T>
__global__ void resized_crop_kernel(const ResizeJob* jobs, int size, Normalize n, T* out) {
  const ResizeJob j = jobs[blockIdx.y];
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= size * size) return;
  const int y = p / size, x = p % size;
  const Taps tx(j.left + (j.flip ? size - 1 - x : x), j.box.width, j.resize_w);
  const Taps ty(j.top + y, j.box.height, j.resize_h);
  // Horizontal then vertical, in float, as the CPU reference.
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
  T* dst = out + (size_t(blockIdx.y) * size * size + p) * 3;
  for (int c = 0; c < 3; ++c) dst[c] = T((fminf(fmaxf(acc[c], 0.f), 255.f) / 255.f - n.mean[c]) / n.std[c]);
}

}  // namespace

ResizeJob train_job(const uint8_t* src, int width, int height, const TrainDraw& draw, int size) {
  return {src, width, height, draw.box, size, size, 0, 0, draw.flip ? 1 : 0};
}

ResizeJob eval_job(const uint8_t* src, int width, int height, int size) {
  const EvalGeometry g = eval_geometry(width, height, size);
  return {src, width, height, {0, 0, height, width}, g.resize_w, g.resize_h, g.top, g.left, 0};
}

void check_job(const ResizeJob& j, int size) {
  const CropBox& b = j.box;
  if (!j.src || b.width <= 0 || b.height <= 0 || b.left < 0 || b.top < 0 || b.left + b.width > j.src_w ||
      b.top + b.height > j.src_h || j.top < 0 || j.left < 0 || j.top + size > j.resize_h || j.left + size > j.resize_w)
    throw core::InputError("GPU resize job outside its image (" + std::to_string(j.src_w) + "x" +
                           std::to_string(j.src_h) + ")");
}

void resized_crop_normalize(const ResizeJob* jobs, int count, const AugmentSpec& spec, void* out, cudaStream_t stream) {
  if (count <= 0) return;
  Normalize n{};
  for (int c = 0; c < 3; ++c) {
    n.mean[c] = spec.mean[c];
    n.std[c] = spec.std[c];
  }
  constexpr int kThreads = 256;
  const dim3 grid((spec.size * spec.size + kThreads - 1) / kThreads, count);
  core::dispatch_activation(spec.out, [&]<class T>() {
    resized_crop_kernel<T><<<grid, kThreads, 0, stream>>>(jobs, spec.size, n, static_cast<T*>(out));
    GPULAB_CHECK_LAUNCH();
  });
}

}  // namespace gpulab::data
