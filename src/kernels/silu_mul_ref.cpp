#include <cmath>

#include "kernels/silu_mul.h"

namespace gpulab::kernels {

void silu_mul_ref(float* out, const float* gate_up, int64_t rows, int64_t inter) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gate_up[r * 2 * inter + i], u = gate_up[r * 2 * inter + inter + i];
      out[r * inter + i] = g / (1.0f + std::exp(-g)) * u;
    }
}

}  // namespace gpulab::kernels
