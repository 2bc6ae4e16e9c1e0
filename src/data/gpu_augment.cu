#include "data/gpu_augment.h"

#include "core/dtype_dispatch.h"
#include "core/error.h"

namespace gpulab::data {

namespace {

struct Normalize {
  float mean[3], std[3];
};

// One thread per output pixel; blockIdx.y is the image.
template <class T>
__global__ void resized_crop_kernel(const ResizeJob* jobs, int size, Normalize n, T* out) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= size * size) return;
  const ResizeJob job = jobs[blockIdx.y];
  float rgb[3];
  resize_pixel(job, size, p % size, p / size, rgb);
  T* dst = out + (size_t(blockIdx.y) * size * size + p) * 3;
  for (int c = 0; c < 3; ++c) dst[c] = T((rgb[c] / 255.f - n.mean[c]) / n.std[c]);
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
