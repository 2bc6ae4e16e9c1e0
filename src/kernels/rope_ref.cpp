#include <cmath>

#include "kernels/rope.h"

namespace gpulab::kernels {

void rope_ref(float* x, int64_t stride, int64_t heads, const int32_t* positions, const float* inv_freq,
              int64_t tokens, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      const float c = std::cos(angle), s = std::sin(angle);
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + t * stride + h * head_dim;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace gpulab::kernels
