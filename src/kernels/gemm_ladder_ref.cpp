#include <algorithm>
#include <thread>
#include <vector>

#include "kernels/gemm_ladder.h"

namespace gpulab::kernels {

void gemm_reference(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  // Rows split across threads; i-k-j order so the inner loop walks B and C contiguously.
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(m, 1));
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([=] {
      std::vector<double> acc(n);
      for (int64_t i = t; i < m; i += threads) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t p = 0; p < k; ++p) {
          const double av = a[i * k + p];
          const float* brow = b + p * n;
          for (int64_t j = 0; j < n; ++j) acc[j] += av * brow[j];
        }
        for (int64_t j = 0; j < n; ++j) c[i * n + j] = static_cast<float>(acc[j]);
      }
    });
  for (auto& th : pool) th.join();
}

}  // namespace gpulab::kernels
