#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "kernels/fp8_quant.h"

namespace gpulab::kernels {

void fp8_quantize_ref(uint8_t* out, float* scales, const float* in, int64_t rows, int64_t cols,
                      Fp8Granularity granularity) {
  std::vector<float> amax(rows, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) amax[r] = std::fmax(amax[r], std::fabs(in[r * cols + c]));
  const float tensor_amax = rows ? *std::max_element(amax.begin(), amax.end()) : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float s = fp8_scale_for_amax(granularity == Fp8Granularity::tensor ? tensor_amax : amax[r]);
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = core::float_to_f8e4m3_bits(in[r * cols + c] / s, true);
    scales[r] = s;
  }
}

void accumulate_ref(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace gpulab::kernels
