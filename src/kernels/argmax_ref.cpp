#include <algorithm>

#include "kernels/argmax.h"

namespace gpulab::kernels {

void argmax_ref(int32_t* out, const float* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    out[r] = static_cast<int32_t>(std::max_element(x + r * cols, x + (r + 1) * cols) - (x + r * cols));
}

}  // namespace gpulab::kernels
