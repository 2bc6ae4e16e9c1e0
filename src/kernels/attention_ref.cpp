#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention.h"
#include "kernels/ref_parallel.h"

namespace gpulab::kernels {

void attention_ref(float* out, int64_t out_stride, const float* q, int64_t q_stride, const float* k,
                   const float* v, int64_t kv_stride, int64_t tokens, int64_t past, const AttentionShape& s,
                   int threads) {
  const int64_t d = s.head_dim, group = s.q_heads / s.kv_heads;
  parallel_for(tokens * s.q_heads, threads, [&](int64_t begin, int64_t end) {
    std::vector<float> p(past + tokens);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t t = job / s.q_heads, h = job % s.q_heads, kvh = h / group;
      const int64_t visible = past + t + 1;
      const float* qv = q + t * q_stride + h * d;
      float mx = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) {
        const float* kv = k + j * kv_stride + kvh * d;
        float dot = 0.f;
        for (int64_t i = 0; i < d; ++i) dot += qv[i] * kv[i];
        p[j] = dot * s.scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < visible; ++j) sum += p[j] = std::exp(p[j] - mx);
      float* o = out + t * out_stride + h * d;
      std::fill_n(o, d, 0.f);
      for (int64_t j = 0; j < visible; ++j) {
        const float w = p[j] / sum;
        const float* vv = v + j * kv_stride + kvh * d;
        for (int64_t i = 0; i < d; ++i) o[i] += w * vv[i];
      }
    }
  });
}

}  // namespace gpulab::kernels
