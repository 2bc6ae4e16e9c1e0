#include <cmath>

#include "kernels/rmsnorm.h"

namespace gpulab::kernels {

void rmsnorm_ref(float* out, const float* in, const float* weight, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * dim;
    float sum_sq = 0.f;
    for (int64_t i = 0; i < dim; ++i) sum_sq += x[i] * x[i];
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = weight[i] * (x[i] * inv_rms);
  }
}

}  // namespace gpulab::kernels
