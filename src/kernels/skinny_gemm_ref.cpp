#include <thread>

#include "kernels/ref_parallel.h"
#include "kernels/skinny_gemm.h"

namespace gpulab::kernels {

void skinny_gemm_ref(double* y, const float* x, const float* w, int64_t m, int64_t n, int64_t k) {
  parallel_for(n, static_cast<int>(std::thread::hardware_concurrency()), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      for (int64_t r = 0; r < m; ++r) {
        double sum = 0;
        for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(x[r * k + i]) * w[c * k + i];
        y[r * n + c] += sum;
      }
  });
}

}  // namespace gpulab::kernels
