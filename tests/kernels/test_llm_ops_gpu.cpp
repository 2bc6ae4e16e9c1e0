// The LLM kernels against their CPU references: fresh random inputs, outputs poisoned with
// NaN before each run, every element checked within atol + rtol·|ref| for the output dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <numeric>

#include "common/gpu.h"
#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/bias_add.h"
#include "kernels/embedding.h"
#include "kernels/fp8_quant.h"
#include "kernels/llm_ops_testing.h"
#include "kernels/pdl.h"
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
    const auto table = device_rope_table(inv_freq, 8192);
    GPULAB_CHECK(cudaMemcpy(d_pos.get(), pos.data(), tokens * 4, cudaMemcpyHostToDevice));
    for (DType dt : kActivationTypes) {
      DeviceTensor qkv(uniform(tokens * width, rng, -2, 2), dt);
      auto* base = static_cast<std::byte*>(qkv.get());
      const size_t es = core::dtype_size(dt);
      rope({base, width, qh}, {base + qh * d * es, width, kvh}, d_pos.get(), table.get(), tokens, d, dt, nullptr);
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
  const int64_t rows = 6;
  // 32000: rows of whole 16-byte pieces, read packed; 32003: element by element.
  for (const int64_t cols : {32000, 32003}) {
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
      EXPECT_EQ(got, want) << dtype_label(dt) << ", " << cols << " columns";
      EXPECT_EQ(got, planted) << dtype_label(dt) << ", " << cols << " columns";
    }
  }
}

struct AttentionCase {
  int64_t head_dim, q_heads, kv_heads;
};
constexpr AttentionCase kAttentionCases[] = {{32, 4, 2}, {64, 8, 8}, {128, 32, 8}, {128, 64, 8}, {256, 4, 1}};

// Sequences whose keys/values live in randomly placed pages of a cache, with a reference
// gather of each sequence's first `len` positions into contiguous rows.
struct PagedCache {
  int64_t block_size, max_blocks, total_blocks;
  std::vector<int32_t> table;
  core::DeviceBuffer<int32_t> d_table;

  PagedCache(const std::vector<int32_t>& lens, int64_t block_size_, std::mt19937& rng) : block_size(block_size_) {
    const int64_t max_len = *std::max_element(lens.begin(), lens.end());
    max_blocks = (max_len + block_size - 1) / block_size;
    total_blocks = 5;  // pages nobody owns
    for (int32_t l : lens) total_blocks += (l + block_size - 1) / block_size;
    std::vector<int32_t> pages(total_blocks);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    table.assign(lens.size() * max_blocks, -1);
    for (size_t s = 0, next = 0; s < lens.size(); ++s)
      for (int64_t b = 0; b < (lens[s] + block_size - 1) / block_size; ++b) table[s * max_blocks + b] = pages[next++];
    d_table = core::DeviceBuffer<int32_t>(table.size());
    GPULAB_CHECK(cudaMemcpy(d_table.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  }
  int64_t slot(size_t seq, int64_t pos) const {
    return table[seq * max_blocks + pos / block_size] * block_size + pos % block_size;
  }
  std::vector<float> gather(const std::vector<float>& cache, size_t seq, int64_t len, int64_t width) const {
    std::vector<float> rows(len * width);
    for (int64_t p = 0; p < len; ++p) std::copy_n(cache.data() + slot(seq, p) * width, width, rows.data() + p * width);
    return rows;
  }
};

core::DeviceBuffer<int32_t> upload_ints(const std::vector<int32_t>& v) {
  core::DeviceBuffer<int32_t> d(v.size());
  GPULAB_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

std::string case_label(const char* what, const AttentionCase& c, DType dt) {
  return std::string(what) + " d " + std::to_string(c.head_dim) + " heads " + std::to_string(c.q_heads) + "/" +
         std::to_string(c.kv_heads) + " " + dtype_label(dt);
}

// Checks `rows` output rows of `width` elements at `stride` apart: every element against want
// (unrounded, rounded here through dt) and the padding past width still poisoned.
void expect_rows_close(const std::vector<float>& got, const std::vector<float>& want, int64_t rows, int64_t width,
                       int64_t stride, DType dt, float atol, const std::string& what) {
  std::vector<float> got_rows, want_rows;
  int64_t padding_written = 0;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < stride; ++i) {
      if (i < width) {
        got_rows.push_back(got[t * stride + i]);
        want_rows.push_back(round_to(want[t * stride + i], dt));
      } else {
        padding_written += !std::isnan(got[t * stride + i]);
      }
    }
  EXPECT_EQ(padding_written, 0) << what << ": output padding written";
  expect_close(got_rows, want_rows, atol, rtol_for(dt), what);
}

using PrefillFn = decltype(&attention_prefill);

// Prefill chunks as (query rows, cached length including them): whole prompts of 1, 17, 1100 and
// 64 positions, chunks after a cached past (64 after 300, 200 after 1100, 130 after 1), single
// queries with a past, a chunk one position short of a page boundary.
const std::vector<int32_t> kChunkQLens = {1, 17, 64, 1, 130, 15, 1100, 200, 64};
const std::vector<int32_t> kChunkKvLens = {1, 17, 364, 50, 131, 47, 1100, 1300, 64};

// Runs `prefill` over random queries (inside fused QKV rows) and a randomly paged cache, and
// checks every output element against attention_ref rounded through dt, that the padding of the
// output rows stays poisoned, and whether attention_prefill would take tensor cores here.
//
// Under a sanitizer the chunks over more than 1000 cached positions are left out: they are most
// of the work, and racecheck ran past 10 minutes over the test's 17 runs with them. The rest
// still span several query and key tiles (130 queries, 364 keys).
void check_prefill(PrefillFn prefill, const AttentionCase& c, DType dt, int64_t block_size, bool tensor_cores,
                   float atol, std::mt19937& rng, const std::string& what) {
  const bool sanitized = !sanitizer_tool().empty();
  std::vector<int32_t> q_lens, kv_lens;
  for (size_t i = 0; i < kChunkQLens.size(); ++i)
    if (!sanitized || kChunkKvLens[i] <= 1000) {
      q_lens.push_back(kChunkQLens[i]);
      kv_lens.push_back(kChunkKvLens[i]);
    }
  std::vector<int32_t> cu = {0};
  for (int32_t l : q_lens) cu.push_back(cu.back() + l);
  const int64_t tokens = cu.back(), num_seqs = q_lens.size();
  const int64_t max_q_len = *std::max_element(q_lens.begin(), q_lens.end());
  const PagedCache pages(kv_lens, block_size, rng);
  auto d_cu = upload_ints(cu), d_kv_lens = upload_ints(kv_lens);
  const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
  const int64_t qd = c.q_heads * c.head_dim, kvd = c.kv_heads * c.head_dim, q_stride = qd + 2 * kvd;
  DeviceTensor q(uniform(tokens * q_stride, rng, -2, 2), dt);
  DeviceTensor k_cache(uniform(pages.total_blocks * block_size * kvd, rng, -2, 2), dt);
  DeviceTensor v_cache(uniform(pages.total_blocks * block_size * kvd, rng, -2, 2), dt);
  const int64_t out_stride = qd + 8;  // a padded output: rows need not be packed
  auto out = DeviceTensor::poisoned(tokens * out_stride, dt);
  const PagedKv kv{k_cache.get(), v_cache.get(), pages.d_table.get(), pages.max_blocks, block_size};
  EXPECT_EQ(attention_prefill_uses_tensor_cores({out.get(), out_stride}, {q.get(), q_stride}, kv, shape, dt),
            tensor_cores)
      << what;
  prefill({out.get(), out_stride}, {q.get(), q_stride}, kv, d_cu.get(), d_kv_lens.get(), num_seqs, max_q_len, shape,
          dt, nullptr);
  std::vector<float> want(tokens * out_stride, 0.f);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const auto k = pages.gather(k_cache.host, s, kv_lens[s], kvd), v = pages.gather(v_cache.host, s, kv_lens[s], kvd);
    attention_ref(want.data() + cu[s] * out_stride, out_stride, q.host.data() + cu[s] * q_stride, q_stride, k.data(),
                  v.data(), kvd, q_lens[s], kv_lens[s] - q_lens[s], shape, 8);
  }
  expect_rows_close(out.download(), want, tokens, qd, out_stride, dt, atol, what);
}

// The tensor-core path rounds each softmax weight p to dt before P·V (relative error <= u) while
// the normaliser sums them in fp32, so an output is off by at most u·max|v| (2 here) before its
// own rounding, which rtol covers; fp16 subnormal weights add at most ~1e-4 over 1300 keys.
float tensor_core_atol(DType dt) { return unit_roundoff(dt) * 2 + 1e-4f; }

// Head dims 64 and 128 with GQA groups 1, 4 and 8.
constexpr AttentionCase kTensorCoreCases[] = {{64, 4, 4}, {64, 8, 2}, {128, 8, 1}, {128, 32, 8}};

TEST(KernelsLlmGpu, PrefillAttentionChunksOverShuffledPages) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(16);
  for (const AttentionCase& c : kTensorCoreCases)
    for (DType dt : {DType::bf16, DType::f16})
      check_prefill(attention_prefill, c, dt, 16, true, tensor_core_atol(dt), rng,
                    case_label("tensor-core prefill", c, dt));
  // Pages of 8 tokens: a 64-key tile gathers 8 pages.
  check_prefill(attention_prefill, {128, 16, 4}, DType::bf16, 8, true, tensor_core_atol(DType::bf16), rng,
                "tensor-core prefill, pages of 8");
  // The scalar tiles: f32 everywhere, bf16 at the head dims without a tensor-core kernel, and
  // bf16 at 128 forced (where attention_prefill would take tensor cores).
  for (const AttentionCase& c : kAttentionCases)
    check_prefill(attention_prefill, c, DType::f32, 16, false, 2e-5f, rng, case_label("prefill", c, DType::f32));
  for (const AttentionCase& c : {kAttentionCases[0], kAttentionCases[4]})
    check_prefill(attention_prefill, c, DType::bf16, 16, false, 2e-3f, rng, case_label("prefill", c, DType::bf16));
  check_prefill(attention_prefill_scalar, {128, 8, 2}, DType::bf16, 16, true, 2e-3f, rng, "scalar prefill d 128 bf16");
}

// Times 2048-token causal prefill attention at the LLaMA-2-7B shape (32 heads of 128, bf16, a
// shuffled paged cache) with both kernels and prints TFLOP/s; asserts only that they agree.
// Under a sanitizer: 512 tokens, each kernel run once and not timed.
TEST(KernelsLlmGpu, PrefillAttentionTensorCoresVsScalarTiming) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(19);
  const int32_t tokens = sanitizer_tool().empty() ? 2048 : 512;
  const AttentionCase c{128, 32, 32};
  const DType dt = DType::bf16;
  const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
  const int64_t qd = c.q_heads * c.head_dim, kvd = c.kv_heads * c.head_dim, q_stride = qd + 2 * kvd;
  const PagedCache pages({tokens}, 16, rng);
  auto d_cu = upload_ints({0, tokens}), d_kv_lens = upload_ints({tokens});
  DeviceTensor q(uniform(tokens * q_stride, rng, -2, 2), dt);
  DeviceTensor k_cache(uniform(pages.total_blocks * 16 * kvd, rng, -2, 2), dt);
  DeviceTensor v_cache(uniform(pages.total_blocks * 16 * kvd, rng, -2, 2), dt);
  const PagedKv kv{k_cache.get(), v_cache.get(), pages.d_table.get(), pages.max_blocks, 16};
  ASSERT_TRUE(attention_prefill_uses_tensor_cores({q.get(), qd}, {q.get(), q_stride}, kv, shape, dt));
  const double flops = 4.0 * tokens * tokens * c.head_dim * c.q_heads / 2;  // causal: half of QKᵀ and PV
  auto time_kernel = [&](PrefillFn prefill, const char* name) {
    auto out = DeviceTensor::poisoned(tokens * qd, dt);
    auto run = [&] {
      prefill({out.get(), qd}, {q.get(), q_stride}, kv, d_cu.get(), d_kv_lens.get(), 1, tokens, shape, dt, nullptr);
    };
    run();  // warm-up, and the output compared below
    if (!sanitizer_tool().empty()) {  // its timings would be the tool's: one run to check is enough
      std::cout << "prefill attention, " << name << ": not timed under " << sanitizer_tool() << "\n";
      return out.download();
    }
    std::vector<float> ms;
    core::EventTimer timer(nullptr);
    for (int i = 0; i < 5; ++i) {
      timer.start();
      run();
      ms.push_back(timer.stop());
    }
    std::sort(ms.begin(), ms.end());
    std::cout << "prefill attention, " << tokens << " tokens x 32 heads x 128, bf16, " << name << ": median "
              << ms[2] << " ms = " << flops / (ms[2] * 1e-3) / 1e12 << " TFLOP/s (min " << ms[0] << " ms)\n";
    return out.download();
  };
  const auto fast = time_kernel(attention_prefill, "tensor cores");
  const auto scalar = time_kernel(attention_prefill_scalar, "scalar fp32 tiles");
  // The scalar output is within 2e-3 of the fp32 reference (the test above).
  expect_close(fast, scalar, tensor_core_atol(dt) + 2e-3f, rtol_for(dt), "tensor cores vs scalar, 2048 tokens");
}

// One decode query per sequence over a randomly paged cache (queries inside fused QKV rows, a
// padded output, a poisoned workspace), every output element against attention_ref. The CUDA-core
// kernel computes in fp32 from the same rounded inputs as the reference, so beyond the output's
// one rounding (rtol) only fp32 reordering noise is left: atol is the f32 one for every dtype.
// The tensor-core kernel rounds the softmax weights to dt, as prefill's does (tensor_core_atol).
//
// `settled`: as the engine decodes (PagedKv::settled), the newest position of each sequence is
// NaN in the cache until rope (at angle 0, so unchanged) stores the k and v of the sequence's
// fused QKV row there, on the stream just before the decode and behind a long rmsnorm. The decode
// starts while the rmsnorm still runs and requests the older rows then: a NaN in the output would
// mean it used the newest row from before rope's store.
using DecodeFn = decltype(&attention_decode);
void check_decode(DecodeFn decode, const AttentionCase& c, DType dt, const std::vector<int32_t>& lens,
                  int64_t max_len, int64_t block_size, std::mt19937& rng, bool settled = false) {
  const int64_t num_seqs = lens.size();
  const PagedCache pages(lens, block_size, rng);
  auto d_lens = upload_ints(lens);
  const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
  const int64_t qd = c.q_heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  const int64_t q_stride = qd + 2 * kvd, out_stride = qd + 8;
  std::vector<float> k_values = uniform(pages.total_blocks * block_size * kvd, rng, -2, 2);
  std::vector<float> v_values = uniform(k_values.size(), rng, -2, 2);
  std::vector<int32_t> newest_slots(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) {
    newest_slots[s] = static_cast<int32_t>(pages.slot(s, lens[s] - 1));
    if (settled)
      for (auto* cache : {&k_values, &v_values}) std::fill_n(cache->begin() + newest_slots[s] * kvd, kvd, NAN);
  }
  DeviceTensor k_cache(std::move(k_values), dt), v_cache(std::move(v_values), dt);
  DeviceTensor q(uniform(num_seqs * q_stride, rng, -2, 2), dt);
  auto out = DeviceTensor::poisoned(num_seqs * out_stride, dt);
  core::DeviceBuffer<std::byte> ws(attention_decode_workspace(num_seqs, max_len, shape));
  GPULAB_CHECK(cudaMemset(ws.get(), 0xFF, ws.bytes()));
  const PagedKv kv{k_cache.get(), v_cache.get(), pages.d_table.get(), pages.max_blocks, block_size, settled};
  const bool tensor_cores = decode == attention_decode_tensor_cores ||
                            (decode == attention_decode &&
                             attention_decode_uses_tensor_cores({q.get(), q_stride}, kv, shape, dt));
  if (settled) {
    core::Stream stream;
    const int64_t norm_rows = 2 * current_sm_count(), norm_dim = int64_t(1) << 19;
    core::DeviceBuffer<float> norm_in(norm_rows * norm_dim);
    core::DeviceBuffer<std::byte> norm_out(norm_rows * norm_dim * core::dtype_size(dt));
    DeviceTensor norm_weight(std::vector<float>(norm_dim, 1.f), dt);
    GPULAB_CHECK(cudaMemset(norm_in.get(), 0, norm_in.bytes()));
    auto positions = upload_ints(std::vector<int32_t>(num_seqs, 0));
    auto slots = upload_ints(newest_slots);
    const auto table = device_rope_table(std::vector<float>(c.head_dim / 2, 0.f), 1);
    GPULAB_CHECK(cudaDeviceSynchronize());
    auto* qkv = static_cast<std::byte*>(q.get());
    const size_t es = core::dtype_size(dt);
    const RopeCacheWrite write{k_cache.get(), v_cache.get(), qkv + (qd + kvd) * es, q_stride, slots.get()};
    rmsnorm(norm_out.get(), dt, norm_in.get(), DType::f32, norm_weight.get(), norm_rows, norm_dim, 1e-5f,
            stream.get());
    rope({qkv, q_stride, c.q_heads}, {qkv + qd * es, q_stride, c.kv_heads}, positions.get(), table.get(),
         num_seqs, c.head_dim, dt, stream.get(), &write);
    decode({out.get(), out_stride}, {q.get(), q_stride}, kv, d_lens.get(), num_seqs, max_len, shape, ws.get(), dt,
           stream.get());
    GPULAB_CHECK(cudaStreamSynchronize(stream.get()));
    for (int64_t s = 0; s < num_seqs; ++s) {  // what the reference reads there
      std::copy_n(q.host.begin() + s * q_stride + qd, kvd, k_cache.host.begin() + newest_slots[s] * kvd);
      std::copy_n(q.host.begin() + s * q_stride + qd + kvd, kvd, v_cache.host.begin() + newest_slots[s] * kvd);
    }
  } else {
    decode({out.get(), out_stride}, {q.get(), q_stride}, kv, d_lens.get(), num_seqs, max_len, shape, ws.get(), dt,
           nullptr);
  }
  std::vector<float> want(num_seqs * out_stride);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const auto k = pages.gather(k_cache.host, s, lens[s], kvd), v = pages.gather(v_cache.host, s, lens[s], kvd);
    attention_ref(want.data() + s * out_stride, out_stride, q.host.data() + s * q_stride, q_stride, k.data(),
                  v.data(), kvd, 1, lens[s] - 1, shape, 8);
  }
  expect_rows_close(out.download(), want, num_seqs, qd, out_stride, dt, tensor_cores ? tensor_core_atol(dt) : 2e-5f,
                    case_label(tensor_cores ? "tensor-core decode" : "decode", c, dt) +
                        (settled ? " settled" : "") + " pages of " +
                        std::to_string(block_size) + " max_len " +
                        std::to_string(max_len));
}

// Head dims 32..256 and GQA groups 1, 2, 3, 4, 8, 12, 16 (3 and 12 run in the kernels for 4 and
// 16 with heads left over), among them the LLaMA-2-7B (32/32 x 128) and LLaMA-3-8B (32/8 x 128)
// shapes and every instantiation that loads a split in several stages to spare registers
// (16-bit: d 32, 64 and 128 at group 16, d 256 at groups 2..16; f32: d 128 at 4..16, d 256).
constexpr AttentionCase kDecodeCases[] = {{32, 4, 2},   {64, 8, 8},   {128, 32, 8}, {128, 64, 8}, {256, 4, 1},
                                          {128, 32, 32}, {128, 32, 2}, {64, 32, 2},  {32, 48, 3}, {256, 32, 2},
                                          {128, 12, 4},  {64, 24, 2},  {256, 8, 4},  {256, 16, 2}};

// Lengths 1 and 3 are fewer rows than one pass of any head dim; 64 one whole split; 65 a whole
// split and one of a single row; 127 and 700 partial last splits; 5000 is 79 splits, more than
// the 64 blocks a (kv head, sequence) gets at most, so blocks merge several splits.
const std::vector<int32_t> kDecodeLens = {1, 3, 64, 65, 127, 700, 5000};

TEST(KernelsLlmGpu, DecodeAttentionOverShuffledPages) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(17);
  for (const AttentionCase& c : kDecodeCases)
    for (DType dt : kActivationTypes) check_decode(attention_decode, c, dt, kDecodeLens, 5000, 16, rng);
}

// Each path forced where attention_decode would take the other: CUDA cores for GQA in 16-bit
// types, tensor cores for one query head per kv head and for groups that leave rows of the mma
// tile empty (3, 12).
TEST(KernelsLlmGpu, DecodeAttentionBothPaths) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(21);
  for (const AttentionCase& c : {AttentionCase{128, 32, 8}, AttentionCase{64, 16, 2}, AttentionCase{128, 64, 8}})
    for (DType dt : {DType::bf16, DType::f16}) {
      check_decode(attention_decode_cuda_cores, c, dt, kDecodeLens, 5000, 16, rng);
      check_decode(attention_decode_tensor_cores, c, dt, kDecodeLens, 5000, 16, rng);
    }
  for (const AttentionCase& c : {AttentionCase{128, 32, 32}, AttentionCase{128, 12, 4}, AttentionCase{64, 48, 4}})
    check_decode(attention_decode_tensor_cores, c, DType::bf16, kDecodeLens, 5000, 16, rng);
  // What the tensor-core path does not take: f32, head_dim 256, more than 16 heads per kv head.
  const PagedCache pages({5}, 16, rng);
  const PagedKv kv{nullptr, nullptr, pages.d_table.get(), pages.max_blocks, 16};
  EXPECT_FALSE(attention_decode_uses_tensor_cores({nullptr, 128 * 12}, kv, {32, 8, 128, 0.1f}, DType::f32));
  EXPECT_FALSE(attention_decode_uses_tensor_cores({nullptr, 256 * 12}, kv, {32, 8, 256, 0.1f}, DType::bf16));
  EXPECT_FALSE(attention_decode_uses_tensor_cores({nullptr, 128 * 34}, kv, {32, 1, 128, 0.1f}, DType::bf16));
  EXPECT_FALSE(attention_decode_uses_tensor_cores({nullptr, 128 * 34}, kv, {32, 32, 128, 0.1f}, DType::bf16));
  EXPECT_TRUE(attention_decode_uses_tensor_cores({nullptr, 128 * 48}, kv, {32, 8, 128, 0.1f}, DType::bf16));
}

// attention_decode_fp8 against attention_decode then fp8_quantize per row: the same bytes and
// scales, with the split pass on tensor cores (GQA, LLaMA-2-70B's 64/8 heads among them) and on
// CUDA cores (one query head per kv head), every byte written.
TEST(KernelsLlmGpu, DecodeAttentionFp8QuantizesAsTheTwoKernels) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(22);
  const std::vector<int32_t>& lens = kDecodeLens;
  const int64_t num_seqs = lens.size(), block_size = 16, max_len = 5000;
  auto d_lens = upload_ints(lens);
  // 80 heads: 10 for a block of the cluster's 8, more than its 8 warps, so warps merge a second head;
  // head sizes 32 and 256: a lane's 1 and 8 elements of a head.
  for (const AttentionCase& c : {AttentionCase{128, 64, 8}, AttentionCase{128, 32, 32}, AttentionCase{64, 12, 4},
                                 AttentionCase{64, 80, 8}, AttentionCase{32, 4, 2}, AttentionCase{256, 4, 1}})
    for (DType dt : {DType::bf16, DType::f16}) {
      const std::string what = case_label("decode fp8", c, dt);
      const PagedCache pages(lens, block_size, rng);
      const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
      const int64_t qd = c.q_heads * c.head_dim, kvd = c.kv_heads * c.head_dim, q_stride = qd + 2 * kvd;
      DeviceTensor k_cache(uniform(pages.total_blocks * block_size * kvd, rng, -2, 2), dt);
      DeviceTensor v_cache(uniform(pages.total_blocks * block_size * kvd, rng, -2, 2), dt);
      DeviceTensor q(uniform(num_seqs * q_stride, rng, -2, 2), dt);
      const PagedKv kv{k_cache.get(), v_cache.get(), pages.d_table.get(), pages.max_blocks, block_size};
      core::DeviceBuffer<std::byte> ws(attention_decode_workspace(num_seqs, max_len, shape));
      auto out = DeviceTensor::poisoned(num_seqs * qd, dt);
      core::DeviceBuffer<uint8_t> two_q(num_seqs * qd), one_q(num_seqs * qd);
      core::DeviceBuffer<float> two_s(num_seqs), one_s(num_seqs);
      GPULAB_CHECK(cudaMemset(one_q.get(), 0xFF, one_q.bytes()));
      GPULAB_CHECK(cudaMemset(one_s.get(), 0xFF, one_s.bytes()));
      attention_decode({out.get(), qd}, {q.get(), q_stride}, kv, d_lens.get(), num_seqs, max_len, shape, ws.get(), dt,
                       nullptr);
      fp8_quantize(two_q.get(), two_s.get(), out.get(), dt, num_seqs, qd, Fp8Granularity::row, nullptr, nullptr);
      attention_decode_fp8(one_q.get(), one_s.get(), {q.get(), q_stride}, kv, d_lens.get(), num_seqs, max_len, shape,
                           ws.get(), dt, nullptr);
      std::vector<uint8_t> one(num_seqs * qd), two(num_seqs * qd);
      std::vector<float> one_scales(num_seqs), two_scales(num_seqs);
      GPULAB_CHECK(cudaMemcpy(one.data(), one_q.get(), one_q.bytes(), cudaMemcpyDeviceToHost));
      GPULAB_CHECK(cudaMemcpy(two.data(), two_q.get(), two_q.bytes(), cudaMemcpyDeviceToHost));
      GPULAB_CHECK(cudaMemcpy(one_scales.data(), one_s.get(), one_s.bytes(), cudaMemcpyDeviceToHost));
      GPULAB_CHECK(cudaMemcpy(two_scales.data(), two_s.get(), two_s.bytes(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(one, two) << what;
      EXPECT_EQ(one_scales, two_scales) << what;
      // 0x7F / 0xFF, the poison, are e4m3 NaN: none left means every byte was written.
      EXPECT_EQ(std::count_if(one.begin(), one.end(), [](uint8_t b) { return (b & 0x7F) == 0x7F; }), 0) << what;
    }
}

// Pages that do not divide the 64-position split (7, 24) or hold more than one (128), so a split
// reads rows of several pages or part of one; and max_len far above every length, as the engine
// passes it, so many blocks find no split of their sequence (and most splits have a block each).
TEST(KernelsLlmGpu, DecodeAttentionPageSizesAndSpareBlocks) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(20);
  const std::vector<int32_t> lens = {1, 3, 17, 64, 65, 200, 640};
  for (int64_t block_size : {7, 24, 128})
    for (const AttentionCase& c : {AttentionCase{128, 32, 32}, AttentionCase{128, 32, 8}, AttentionCase{64, 24, 2},
                                   AttentionCase{256, 4, 1}, AttentionCase{32, 4, 2}})
      for (DType dt : {DType::bf16, DType::f16}) check_decode(attention_decode, c, dt, lens, 8192, block_size, rng);
  // Blocks that merge several splits, over pages that straddle them.
  for (const AttentionCase& c : {AttentionCase{128, 32, 8}, AttentionCase{128, 32, 2}})
    check_decode(attention_decode, c, DType::bf16, kDecodeLens, 5000, 24, rng);
}

// The engine's decode (PagedKv::settled) on both paths, with a length on each side of a split's
// end, where the newest position is a split's last row or its first.
TEST(KernelsLlmGpu, DecodeAttentionSettledTakesTheNewestRowAfterTheWait) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(23);
  for (const AttentionCase& c : {AttentionCase{128, 32, 32}, AttentionCase{128, 64, 8}, AttentionCase{64, 16, 2}})
    for (DType dt : {DType::bf16, DType::f16}) {
      check_decode(attention_decode, c, dt, kDecodeLens, 5000, 16, rng, true);
      check_decode(attention_decode_cuda_cores, c, dt, kDecodeLens, 5000, 16, rng, true);
    }
}

// PagedKv::append against rope() with a cache store, then the decode: the same output bits, and
// the same cache bits (the last sequence has no slot: nothing stored, its output not compared).
// Length 5000 gives blocks two splits, so the newest position is a block's second split there.
void check_decode_append(DecodeFn decode, const AttentionCase& c, DType dt, std::mt19937& rng) {
  std::vector<int32_t> lens = kDecodeLens;
  lens.push_back(70);
  const int64_t num_seqs = lens.size(), block_size = 16, max_len = 5000;
  const PagedCache pages(lens, block_size, rng);
  auto d_lens = upload_ints(lens);
  const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
  const int64_t qd = c.q_heads * c.head_dim, kvd = c.kv_heads * c.head_dim, q_stride = qd + 2 * kvd;
  std::vector<int32_t> positions(num_seqs), slots(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) {
    positions[s] = std::uniform_int_distribution<int32_t>(0, 8191)(rng);
    slots[s] = s + 1 < num_seqs ? static_cast<int32_t>(pages.slot(s, lens[s] - 1)) : -1;
  }
  auto d_positions = upload_ints(positions), d_slots = upload_ints(slots);
  std::vector<float> inv_freq(c.head_dim / 2);
  for (int64_t i = 0; i < c.head_dim / 2; ++i) inv_freq[i] = 1.0f / std::pow(10000.0f, 2.0f * i / c.head_dim);
  const auto table = device_rope_table(inv_freq, 8192);
  const auto k_values = uniform(pages.total_blocks * block_size * kvd, rng, -2, 2);
  const auto v_values = uniform(k_values.size(), rng, -2, 2), qkv_values = uniform(num_seqs * q_stride, rng, -2, 2);
  core::DeviceBuffer<std::byte> ws(attention_decode_workspace(num_seqs, max_len, shape));
  const size_t es = core::dtype_size(dt);
  struct Run {
    std::vector<float> out, k_cache, v_cache;
  };
  const auto run = [&](bool append) {
    DeviceTensor k_cache(k_values, dt), v_cache(v_values, dt), qkv(qkv_values, dt);
    auto out = DeviceTensor::poisoned(num_seqs * qd, dt);
    auto* q = static_cast<std::byte*>(qkv.get());
    const DecodeAppend added{{q + qd * es, q_stride}, {q + (qd + kvd) * es, q_stride}, d_positions.get(),
                             d_slots.get(), table.get()};
    if (!append) {
      const RopeCacheWrite write{k_cache.get(), v_cache.get(), q + (qd + kvd) * es, q_stride, d_slots.get()};
      rope({q, q_stride, c.q_heads}, {q + qd * es, q_stride, c.kv_heads}, d_positions.get(), table.get(), num_seqs,
           c.head_dim, dt, nullptr, &write);
    }
    const PagedKv kv{k_cache.get(), v_cache.get(), pages.d_table.get(), pages.max_blocks, block_size, false,
                     append ? &added : nullptr};
    decode({out.get(), qd}, {q, q_stride}, kv, d_lens.get(), num_seqs, max_len, shape, ws.get(), dt, nullptr);
    Run r{out.download(), k_cache.download(), v_cache.download()};
    r.out.resize((num_seqs - 1) * qd);
    return r;
  };
  const Run want = run(false), got = run(true);
  const std::string what = case_label("decode append", c, dt);
  EXPECT_EQ(got.out, want.out) << what;
  EXPECT_EQ(got.k_cache, want.k_cache) << what;
  EXPECT_EQ(got.v_cache, want.v_cache) << what;
}

TEST(KernelsLlmGpu, DecodeAttentionAppendsAsRopeThenDecode) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 rng(24);
  for (const AttentionCase& c : {AttentionCase{128, 32, 32}, AttentionCase{128, 64, 8}, AttentionCase{64, 16, 2},
                                 AttentionCase{256, 8, 4}, AttentionCase{32, 4, 2}})
    for (DType dt : kActivationTypes) check_decode_append(attention_decode, c, dt, rng);
  for (DType dt : {DType::bf16, DType::f16}) {
    check_decode_append(attention_decode_cuda_cores, AttentionCase{128, 64, 8}, dt, rng);
    check_decode_append(attention_decode_tensor_cores, AttentionCase{128, 32, 32}, dt, rng);
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
