// rope with a cache destination against rope followed by kv_cache_write: the same rotated q/k
// rows and the same cache contents, bit for bit (slots of padding tokens and unused slots
// untouched).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/gpu.h"
#include "kernels/attention.h"
#include "kernels/llm_ops_testing.h"
#include "kernels/rope.h"

namespace gpulab::kernels {
namespace {

using namespace testing;
using core::DType;

TEST(KernelsLlmGpu, RopeWritesTheKvCacheAsKvCacheWriteDoes) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(19);
  for (int64_t d : {32, 128}) {
    const int64_t tokens = 13, qh = 8, kvh = 2, width = (qh + 2 * kvh) * d, row = kvh * d, slots_total = 40;
    std::vector<float> inv_freq(d / 2);
    for (int64_t i = 0; i < d / 2; ++i) inv_freq[i] = 1.0f / std::pow(10000.0f, 2.0f * i / d);
    std::vector<int32_t> pos(tokens), slots(slots_total);
    for (auto& p : pos) p = std::uniform_int_distribution<int32_t>(0, 4095)(rng);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(tokens);
    slots[3] = -1;  // padding: written nowhere
    core::DeviceBuffer<int32_t> d_pos(tokens), d_slots(tokens);
    const auto table = device_rope_table(inv_freq, 4096);
    GPULAB_CHECK(cudaMemcpy(d_pos.get(), pos.data(), tokens * 4, cudaMemcpyHostToDevice));
    GPULAB_CHECK(cudaMemcpy(d_slots.get(), slots.data(), tokens * 4, cudaMemcpyHostToDevice));
    for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
      const std::vector<float> qkv_values = uniform(tokens * width, rng, -2, 2);
      const std::vector<float> k_values = uniform(slots_total * row, rng), v_values = uniform(slots_total * row, rng);
      DeviceTensor qkv_a(qkv_values, dt), k_a(k_values, dt), v_a(v_values, dt);  // rope, then kv_cache_write
      DeviceTensor qkv_b(qkv_values, dt), k_b(k_values, dt), v_b(v_values, dt);  // rope writing the cache
      const size_t es = core::dtype_size(dt);
      auto* a = static_cast<std::byte*>(qkv_a.get());
      auto* b = static_cast<std::byte*>(qkv_b.get());
      rope({a, width, qh}, {a + qh * d * es, width, kvh}, d_pos.get(), table.get(), tokens, d, dt, nullptr);
      kv_cache_write(k_a.get(), v_a.get(), {a + qh * d * es, width}, {a + (qh + kvh) * d * es, width}, d_slots.get(),
                     tokens, kvh, d, dt, nullptr);
      const RopeCacheWrite cache{k_b.get(), v_b.get(), b + (qh + kvh) * d * es, width, d_slots.get()};
      rope({b, width, qh}, {b + qh * d * es, width, kvh}, d_pos.get(), table.get(), tokens, d, dt, nullptr, &cache);
      const std::string what = "d " + std::to_string(d) + " " + dtype_label(dt);
      expect_close(qkv_b.download(), qkv_a.download(), 0, 0, "qkv " + what);
      expect_close(k_b.download(), k_a.download(), 0, 0, "k cache " + what);
      expect_close(v_b.download(), v_a.download(), 0, 0, "v cache " + what);
      EXPECT_NE(k_b.download(), k_b.host) << "nothing written: " << what;
    }
  }
}

}  // namespace
}  // namespace gpulab::kernels
