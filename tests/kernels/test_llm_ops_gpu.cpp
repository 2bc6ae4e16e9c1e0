// The LLM kernels against their CPU references: fresh random inputs, outputs poisoned with
// NaN before each run, every element checked within atol + rtol·|ref| for the output dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "common/gpu.h"
#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/bias_add.h"
#include "kernels/embedding.h"
#include "kernels/llm_ops_testing.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace gpulab::kernels {
namespace {

using namespace testing;
using core::DType;

constexpr DType kActivationTypes[] = {DType::f32, DType::bf16, DType::f16};

std::vector<float> round_all(std::vector<float> v, DType dt) {
  for (float& x : v) x = round_to(x, dt);
  return v;
}

// Tolerance of a result computed in float32 and rounded once to `dt`: one rounding plus
// float32 reordering noise.
float rtol_for(DType dt) { return 2 * unit_roundoff(dt) + 1e-5f; }

TEST(KernelsLlmGpu, EmbeddingGatherIsExact) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(11);
  const int64_t vocab = 1000, hidden = 96, tokens = 37;
  std::vector<int32_t> ids(tokens);
  for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
  ids[0] = 0;
  ids[1] = vocab - 1;
  core::DeviceBuffer<int32_t> d_ids(tokens);
  GPULAB_CHECK(cudaMemcpy(d_ids.get(), ids.data(), tokens * 4, cudaMemcpyHostToDevice));
  for (DType table_dt : kActivationTypes)
    for (DType out_dt : {DType::f32, table_dt}) {
      DeviceTensor table(uniform(vocab * hidden, rng, -3, 3), table_dt);
      auto out = DeviceTensor::poisoned(tokens * hidden, out_dt);
      embedding(out.get(), out_dt, table.get(), table_dt, d_ids.get(), tokens, hidden, nullptr);
      std::vector<float> want(tokens * hidden);
      embedding_ref(want.data(), table.host.data(), ids.data(), tokens, hidden);
      expect_close(out.download(), want, 0, 0, "embedding " + dtype_label(table_dt) + "->" + dtype_label(out_dt));
    }
}

TEST(KernelsLlmGpu, RmsNormMixedDtypes) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(12);
  for (int64_t dim : {128, 4096, 5003}) {
    const int64_t rows = 9;
    for (DType in_dt : {DType::f32, DType::bf16})
      for (DType out_dt : kActivationTypes) {
        DeviceTensor in(uniform(rows * dim, rng, -4, 4), in_dt);
        DeviceTensor w(uniform(dim, rng, 0.5f, 1.5f), out_dt);
        auto out = DeviceTensor::poisoned(rows * dim, out_dt);
        rmsnorm(out.get(), out_dt, in.get(), in_dt, w.get(), rows, dim, 1e-5f, nullptr);
        std::vector<float> want(rows * dim);
        rmsnorm_ref(want.data(), in.host.data(), w.host.data(), rows, dim, 1e-5f);
        expect_close(out.download(), round_all(want, out_dt), 1e-6f, rtol_for(out_dt),
                     "rmsnorm dim " + std::to_string(dim) + " " + dtype_label(in_dt) + "->" + dtype_label(out_dt));
      }
  }
}

TEST(KernelsLlmGpu, RopeInPlaceOnFusedQkv) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(13);
  for (int64_t d : {32, 128}) {
    const int64_t tokens = 19, qh = 8, kvh = 2, width = (qh + 2 * kvh) * d;
    std::vector<float> inv_freq(d / 2);
    for (int64_t i = 0; i < d / 2; ++i) inv_freq[i] = 1.0f / std::pow(500000.0f, 2.0f * i / d);
    std::vector<int32_t> pos(tokens);
    for (auto& p : pos) p = std::uniform_int_distribution<int32_t>(0, 8191)(rng);
    pos[0] = 0;
    core::DeviceBuffer<int32_t> d_pos(tokens);
    core::DeviceBuffer<float> d_inv(d / 2);
    GPULAB_CHECK(cudaMemcpy(d_pos.get(), pos.data(), tokens * 4, cudaMemcpyHostToDevice));
    GPULAB_CHECK(cudaMemcpy(d_inv.get(), inv_freq.data(), d * 2, cudaMemcpyHostToDevice));
    for (DType dt : kActivationTypes) {
      DeviceTensor qkv(uniform(tokens * width, rng, -2, 2), dt);
      auto* base = static_cast<std::byte*>(qkv.get());
      const size_t es = core::dtype_size(dt);
      rope({base, width, qh}, {base + qh * d * es, width, kvh}, d_pos.get(), d_inv.get(), tokens, d, dt, nullptr);
      std::vector<float> want = qkv.host;
      rope_ref(want.data(), width, qh, pos.data(), inv_freq.data(), tokens, d);
      rope_ref(want.data() + qh * d, width, kvh, pos.data(), inv_freq.data(), tokens, d);
      // v (the last kvh heads of each row) must come back untouched: the tolerance is 0 there
      // only because want holds the original values.
      expect_close(qkv.download(), round_all(want, dt), 2e-6f, rtol_for(dt), "rope d " + std::to_string(d) + " " + dtype_label(dt));
    }
  }
}

TEST(KernelsLlmGpu, SiluMulAndBiasAdd) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(14);
  const int64_t rows = 13, inter = 1411;
  for (DType dt : kActivationTypes) {
    DeviceTensor gate_up(uniform(rows * 2 * inter, rng, -6, 6), dt);
    auto out = DeviceTensor::poisoned(rows * inter, dt);
    silu_mul(out.get(), gate_up.get(), rows, inter, dt, nullptr);
    std::vector<float> want(rows * inter);
    silu_mul_ref(want.data(), gate_up.host.data(), rows, inter);
    expect_close(out.download(), round_all(want, dt), 1e-6f, rtol_for(dt), "silu_mul " + dtype_label(dt));

    DeviceTensor x(uniform(rows * inter, rng), dt), bias(uniform(inter, rng), dt);
    bias_add(x.get(), bias.get(), rows, inter, dt, nullptr);
    std::vector<float> want_x = x.host;
    bias_add_ref(want_x.data(), bias.host.data(), rows, inter);
    expect_close(x.download(), round_all(want_x, dt), 1e-6f, rtol_for(dt), "bias_add " + dtype_label(dt));
  }
}

TEST(KernelsLlmGpu, ArgmaxFirstOfTies) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(15);
  const int64_t rows = 6, cols = 32000;
  for (DType dt : kActivationTypes) {
    std::vector<float> x = uniform(rows * cols, rng, -10, 10);
    std::vector<int32_t> planted(rows);
    for (int64_t r = 0; r < rows; ++r) {
      planted[r] = std::uniform_int_distribution<int32_t>(0, cols - 2)(rng);
      x[r * cols + planted[r]] = 20.f;
      x[r * cols + cols - 1] = 20.f;  // a tie later in the row: the first index wins
    }
    x[0] = 20.f;  // row 0: the very first element wins
    planted[0] = 0;
    DeviceTensor d_x(x, dt);
    core::DeviceBuffer<int32_t> out(rows);
    GPULAB_CHECK(cudaMemset(out.get(), 0xFF, rows * 4));
    argmax(out.get(), d_x.get(), rows, cols, dt, nullptr);
    std::vector<int32_t> got(rows), want(rows);
    GPULAB_CHECK(cudaMemcpy(got.data(), out.get(), rows * 4, cudaMemcpyDeviceToHost));
    argmax_ref(want.data(), d_x.host.data(), rows, cols);
    EXPECT_EQ(got, want) << dtype_label(dt);
    EXPECT_EQ(got, planted) << dtype_label(dt);
  }
}

struct AttentionCase {
  int64_t head_dim, q_heads, kv_heads;
};
constexpr AttentionCase kAttentionCases[] = {{32, 4, 2}, {64, 8, 8}, {128, 32, 8}, {128, 64, 8}, {256, 4, 1}};

TEST(KernelsLlmGpu, PrefillAttentionCausalGqaPacked) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(16);
  const std::vector<int32_t> lens = {1, 77, 200, 64};
  std::vector<int32_t> cu = {0};
  for (int32_t l : lens) cu.push_back(cu.back() + l);
  const int64_t tokens = cu.back();
  core::DeviceBuffer<int32_t> d_cu(cu.size());
  GPULAB_CHECK(cudaMemcpy(d_cu.get(), cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  for (const AttentionCase& c : kAttentionCases)
    for (DType dt : {DType::bf16, DType::f32}) {
      const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
      const int64_t qd = c.q_heads * c.head_dim, kvd = c.kv_heads * c.head_dim, width = qd + 2 * kvd;
      DeviceTensor qkv(uniform(tokens * width, rng, -2, 2), dt);
      const int64_t out_stride = qd + 8;  // a padded output: rows need not be packed
      auto out = DeviceTensor::poisoned(tokens * out_stride, dt);
      const size_t es = core::dtype_size(dt);
      auto* base = static_cast<const std::byte*>(qkv.get());
      attention_prefill({out.get(), out_stride}, {base, width}, {base + qd * es, width}, {base + (qd + kvd) * es, width},
                        d_cu.get(), lens.size(), 200, shape, dt, nullptr);
      std::vector<float> want(tokens * out_stride, 0.f);
      for (size_t s = 0; s < lens.size(); ++s) {
        const float* row = qkv.host.data() + cu[s] * width;
        attention_ref(want.data() + cu[s] * out_stride, out_stride, row, width, row + qd, row + qd + kvd, width, lens[s], 0,
                      shape, 4);
      }
      std::vector<float> got = out.download(), got_rows, want_rows;
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t i = 0; i < out_stride; ++i) {
          if (i < qd) {
            got_rows.push_back(got[t * out_stride + i]);
            want_rows.push_back(round_to(want[t * out_stride + i], dt));
          } else {
            EXPECT_TRUE(std::isnan(got[t * out_stride + i])) << "padding written at row " << t;
          }
        }
      expect_close(got_rows, want_rows, dt == DType::f32 ? 2e-5f : 2e-3f, rtol_for(dt),
                   "prefill d " + std::to_string(c.head_dim) + " heads " + std::to_string(c.q_heads) + "/" +
                       std::to_string(c.kv_heads) + " " + dtype_label(dt));
    }
}

TEST(KernelsLlmGpu, DecodeAttentionOverShuffledPages) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(17);
  const std::vector<int32_t> lens = {1, 255, 256, 700, 33};
  const int64_t block_size = 16, num_seqs = lens.size(), max_len = 700;
  const int64_t max_blocks = (max_len + block_size - 1) / block_size;
  int64_t total_blocks = 0;
  for (int32_t l : lens) total_blocks += (l + block_size - 1) / block_size;
  total_blocks += 5;  // pages nobody owns
  // Each sequence owns a random, non-contiguous set of pages.
  std::vector<int32_t> pages(total_blocks);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<int32_t> table(num_seqs * max_blocks, -1);
  for (int64_t s = 0, next = 0; s < num_seqs; ++s)
    for (int64_t b = 0; b < (lens[s] + block_size - 1) / block_size; ++b) table[s * max_blocks + b] = pages[next++];
  core::DeviceBuffer<int32_t> d_table(table.size()), d_lens(num_seqs);
  GPULAB_CHECK(cudaMemcpy(d_table.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemcpy(d_lens.get(), lens.data(), num_seqs * 4, cudaMemcpyHostToDevice));

  for (const AttentionCase& c : kAttentionCases)
    for (DType dt : {DType::bf16, DType::f32}) {
      const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
      const int64_t qd = c.q_heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
      DeviceTensor k_cache(uniform(total_blocks * block_size * kvd, rng, -2, 2), dt);
      DeviceTensor v_cache(uniform(total_blocks * block_size * kvd, rng, -2, 2), dt);
      const int64_t q_stride = qd + 2 * kvd;  // queries inside a fused QKV row
      DeviceTensor q(uniform(num_seqs * q_stride, rng, -2, 2), dt);
      auto out = DeviceTensor::poisoned(num_seqs * qd, dt);
      core::DeviceBuffer<std::byte> ws(attention_decode_workspace(num_seqs, max_len, shape));
      GPULAB_CHECK(cudaMemset(ws.get(), 0xFF, ws.bytes()));
      const PagedKv kv{k_cache.get(), v_cache.get(), d_table.get(), max_blocks, block_size};
      attention_decode({out.get(), qd}, {q.get(), q_stride}, kv, d_lens.get(), num_seqs, max_len, shape, ws.get(), dt,
                       nullptr);
      std::vector<float> want(num_seqs * qd);
      for (int64_t s = 0; s < num_seqs; ++s) {
        std::vector<float> k(lens[s] * kvd), v(lens[s] * kvd);
        for (int64_t p = 0; p < lens[s]; ++p) {
          const int64_t slot = table[s * max_blocks + p / block_size] * block_size + p % block_size;
          std::copy_n(k_cache.host.data() + slot * kvd, kvd, k.data() + p * kvd);
          std::copy_n(v_cache.host.data() + slot * kvd, kvd, v.data() + p * kvd);
        }
        attention_ref(want.data() + s * qd, qd, q.host.data() + s * q_stride, q_stride, k.data(), v.data(), kvd, 1,
                      lens[s] - 1, shape, 4);
      }
      expect_close(out.download(), round_all(want, dt), dt == DType::f32 ? 2e-5f : 2e-3f, rtol_for(dt),
                   "decode d " + std::to_string(c.head_dim) + " heads " + std::to_string(c.q_heads) + "/" +
                       std::to_string(c.kv_heads) + " " + dtype_label(dt));
    }
}

TEST(KernelsLlmGpu, KvCacheWriteScattersToSlots) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(18);
  const int64_t kv_heads = 2, d = 64, width = kv_heads * d, slots_total = 64, tokens = 10, stride = 3 * width;
  std::vector<int32_t> slots(slots_total);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(tokens);
  slots[4] = -1;  // padding token: written nowhere
  core::DeviceBuffer<int32_t> d_slots(tokens);
  GPULAB_CHECK(cudaMemcpy(d_slots.get(), slots.data(), tokens * 4, cudaMemcpyHostToDevice));
  for (DType dt : kActivationTypes) {
    DeviceTensor src(uniform(tokens * stride, rng), dt);
    DeviceTensor k_cache(uniform(slots_total * width, rng), dt), v_cache(uniform(slots_total * width, rng), dt);
    const size_t es = core::dtype_size(dt);
    auto* base = static_cast<const std::byte*>(src.get());
    kv_cache_write(k_cache.get(), v_cache.get(), {base + width * es, stride}, {base + 2 * width * es, stride}, d_slots.get(),
                   tokens, kv_heads, d, dt, nullptr);
    std::vector<float> want_k = k_cache.host, want_v = v_cache.host;
    for (int64_t t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      std::copy_n(src.host.data() + t * stride + width, width, want_k.data() + slots[t] * width);
      std::copy_n(src.host.data() + t * stride + 2 * width, width, want_v.data() + slots[t] * width);
    }
    expect_close(k_cache.download(), want_k, 0, 0, "kv write k " + dtype_label(dt));
    expect_close(v_cache.download(), want_v, 0, 0, "kv write v " + dtype_label(dt));
  }
}

}  // namespace
}  // namespace gpulab::kernels
