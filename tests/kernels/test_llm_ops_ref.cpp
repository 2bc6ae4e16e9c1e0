// Properties of the LLM ops' CPU references that hold without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace gpulab::kernels {
namespace {

TEST(KernelsLlmRef, RopeIsARotation) {
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  const int64_t d = 64, heads = 3;
  std::vector<float> x(heads * d), orig;
  for (float& v : x) v = n(rng);
  orig = x;
  std::vector<float> inv(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / d);
  const int32_t zero = 0, pos = 1234;
  rope_ref(x.data(), heads * d, heads, &zero, inv.data(), 1, d);
  EXPECT_EQ(x, orig);  // position 0 is the identity
  rope_ref(x.data(), heads * d, heads, &pos, inv.data(), 1, d);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < d / 2; ++i) {
      const float* a = orig.data() + h * d;
      const float* b = x.data() + h * d;
      EXPECT_NEAR(a[i] * a[i] + a[i + d / 2] * a[i + d / 2], b[i] * b[i] + b[i + d / 2] * b[i + d / 2], 1e-4f);
      const float angle = pos * inv[i];
      EXPECT_NEAR(b[i], a[i] * std::cos(angle) - a[i + d / 2] * std::sin(angle), 1e-5f);
    }
}

TEST(KernelsLlmRef, AttentionOfOneKeyIsItsValueAndUniformKeysAverage) {
  const AttentionShape s{4, 2, 8, 0.5f};
  std::vector<float> q(4 * 8), k(3 * 2 * 8, 0.f), v(3 * 2 * 8), out(3 * 4 * 8);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(float(i));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  // Query 0 sees key 0 only; with equal (zero) keys, query 2 averages values 0..2.
  std::vector<float> q3(3 * 4 * 8);
  for (size_t i = 0; i < q3.size(); ++i) q3[i] = std::cos(float(i));
  attention_ref(out.data(), 32, q3.data(), 32, k.data(), v.data(), 16, 3, 0, s);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < 8; ++i) {
      const int64_t kvh = h / 2;
      EXPECT_FLOAT_EQ(out[h * 8 + i], v[kvh * 8 + i]);
      EXPECT_NEAR(out[2 * 32 + h * 8 + i], (v[kvh * 8 + i] + v[16 + kvh * 8 + i] + v[32 + kvh * 8 + i]) / 3, 1e-4f);
    }
}

TEST(KernelsLlmRef, RmsNormSiluArgmax) {
  const std::vector<float> x = {3.f, -4.f}, w = {1.f, 2.f};
  std::vector<float> out(2);
  rmsnorm_ref(out.data(), x.data(), w.data(), 1, 2, 0.f);
  const float rms = std::sqrt(12.5f);
  EXPECT_FLOAT_EQ(out[0], 3.f / rms);
  EXPECT_FLOAT_EQ(out[1], -8.f / rms);
  const std::vector<float> gu = {0.f, 2.f, 5.f, 7.f};  // gate {0, 2}, up {5, 7}
  std::vector<float> act(2);
  silu_mul_ref(act.data(), gu.data(), 1, 2);
  EXPECT_FLOAT_EQ(act[0], 0.f);
  EXPECT_NEAR(act[1], 2.f / (1 + std::exp(-2.f)) * 7.f, 1e-6f);
  const std::vector<float> row = {1.f, 5.f, 5.f, -2.f};
  int32_t idx = -1;
  argmax_ref(&idx, row.data(), 1, 4);
  EXPECT_EQ(idx, 1);
}

// Which prefill kernel runs is decided on the host: tensor cores for bf16/fp16 at head_dim 64 and
// 128 with 16-byte aligned q and cache (4-byte aligned output), the scalar tiles otherwise.
TEST(KernelsLlmRef, PrefillTakesTensorCoresOnlyWhereItCan) {
  alignas(16) static uint16_t buf[64];
  const AttentionShape d128{32, 8, 128, 0.1f}, d64{8, 8, 64, 0.1f}, d32{4, 2, 32, 0.1f}, d256{4, 1, 256, 0.1f};
  const int64_t stride = 48 * 128;  // a fused QKV row
  const PagedKv kv{buf, buf, nullptr, 1, 16};
  auto uses = [&](const AttentionShape& shape, core::DType dt, const void* q, int64_t q_stride, void* out,
                  int64_t out_stride, const PagedKv& cache) {
    return attention_prefill_uses_tensor_cores({out, out_stride}, {q, q_stride}, cache, shape, dt);
  };
  for (core::DType dt : {core::DType::bf16, core::DType::f16}) {
    EXPECT_TRUE(uses(d128, dt, buf, stride, buf, 4096, kv));
    EXPECT_TRUE(uses(d64, dt, buf, stride, buf, 4096 + 2, kv));  // the output needs only pairs aligned
    EXPECT_FALSE(uses(d32, dt, buf, stride, buf, 4096, kv));
    EXPECT_FALSE(uses(d256, dt, buf, stride, buf, 4096, kv));
    EXPECT_FALSE(uses(d128, dt, buf, stride + 4, buf, 4096, kv));  // q rows 8-byte aligned only
    EXPECT_FALSE(uses(d128, dt, buf + 4, stride, buf, 4096, kv));
    EXPECT_FALSE(uses(d128, dt, buf, stride, buf, 4096 + 1, kv));  // odd output stride
    EXPECT_FALSE(uses(d128, dt, buf, stride, buf, 4096, {buf + 1, buf, nullptr, 1, 16}));
    EXPECT_FALSE(uses(d128, dt, buf, stride, buf, 4096, {buf, buf + 4, nullptr, 1, 16}));
  }
  EXPECT_FALSE(uses(d128, core::DType::f32, buf, stride, buf, 4096, kv));
}

}  // namespace
}  // namespace gpulab::kernels
