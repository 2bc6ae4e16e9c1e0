// Tensor parallelism on the CPU: the layout rules, sharded loading (each rank's slices equal the
// parts of the whole tensors they stand for, from single-file and sharded checkpoints, bf16 and
// converted dtypes, random weights), and the sharded math: TP = 2/4/8 ranks, each computing on
// its own shard, all-reduces and the logits gather done on the host, against the unsharded
// CPU reference.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>

#include "core/error.h"
#include "core/safetensors.h"
#include "kernels/attention.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"
#include "llm/cpu_model.h"
#include "llm/fixtures.h"
#include "llm/make_engine.h"
#include "llm/tensor_parallel.h"
#include "llm/tp_engine.h"
#include "llm/tp_processes.h"

namespace gpulab::llm {
namespace {

namespace fs = std::filesystem;

WeightSource fixture(const std::string& name) { return WeightSource::from_checkpoint(testing::fixture_dir(name)); }

LlamaConfig gqa_config() { return testing::gqa_test_config(); }

// ---------------------------------------------------------------------------------------------
// Layout

TEST(ShardLayout, SplitsHeadsKvHeadsMlpAndVocab) {
  const LlamaConfig c = read_model_config(testing::fixture_dir("llama_tiny"));  // 4 heads, 2 KV heads
  for (int r = 0; r < 2; ++r) {
    const ShardLayout L = shard_layout(c, {r, 2});
    EXPECT_EQ(L.num_heads, 2);
    EXPECT_EQ(L.q_head_begin, 2 * r);
    EXPECT_EQ(L.num_kv_heads, 1);
    EXPECT_EQ(L.kv_head_begin, r);
    EXPECT_EQ(L.intermediate, 176);
    EXPECT_EQ(L.inter_begin, 176 * r);
    EXPECT_EQ(L.vocab_rows, 512);
    EXPECT_EQ(L.vocab_begin, 512 * r);
    EXPECT_EQ(L.vocab_count, 512);
  }
  // TP 4: one query head per rank, KV head 0 on ranks 0-1 and 1 on ranks 2-3 (replicated).
  for (int r = 0; r < 4; ++r) {
    const ShardLayout L = shard_layout(c, {r, 4});
    EXPECT_EQ(L.num_heads, 1);
    EXPECT_EQ(L.q_head_begin, r);
    EXPECT_EQ(L.num_kv_heads, 1);
    EXPECT_EQ(L.kv_head_begin, r / 2);
  }
  const ShardLayout one = shard_layout(c, {0, 1});
  EXPECT_EQ(one.num_heads, 4);
  EXPECT_EQ(one.num_kv_heads, 2);
  EXPECT_EQ(one.vocab_count, 1024);
  const LlamaConfig part = shard_config(c, shard_layout(c, {1, 2}));
  EXPECT_EQ(part.num_heads, 2);
  EXPECT_EQ(part.num_kv_heads, 1);
  EXPECT_EQ(part.intermediate_size, 176);
  EXPECT_EQ(part.hidden_size, 128);
  EXPECT_EQ(part.vocab_size, 1024);
}

TEST(ShardLayout, UnevenVocabularyPadsTheLastRank) {
  const LlamaConfig c = gqa_config();
  int64_t covered = 0;
  for (int r = 0; r < 8; ++r) {
    const ShardLayout L = shard_layout(c, {r, 8});
    EXPECT_EQ(L.vocab_rows, 126);
    EXPECT_EQ(L.vocab_begin, covered);
    EXPECT_EQ(L.vocab_count, r < 7 ? 126 : 1003 - 7 * 126);
    EXPECT_EQ(L.kv_head_begin, r / 4);  // 8 query heads, 2 KV heads: 4 ranks share each
    covered += L.vocab_count;
  }
  EXPECT_EQ(covered, 1003);
}

TEST(ShardLayout, ModelsThatDoNotSplitAreInputErrors) {
  const LlamaConfig c = read_model_config(testing::fixture_dir("llama_tiny"));
  EXPECT_THROW(shard_layout(c, {0, 8}), core::InputError);  // 4 heads
  EXPECT_THROW(shard_layout(c, {0, 3}), core::InputError);
  EXPECT_THROW(shard_layout(c, {0, 0}), core::InputError);
  LlamaConfig kv6 = gqa_config();
  kv6.num_heads = 24;
  kv6.num_kv_heads = 6;  // neither splits 4 ways nor divides 4
  EXPECT_THROW(shard_layout(kv6, {0, 4}), core::InputError);
  LlamaConfig mlp = gqa_config();
  mlp.intermediate_size = 162;
  EXPECT_THROW(shard_layout(mlp, {0, 4}), core::InputError);
  try {
    shard_layout(c, {0, 8});
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("4 attention heads"), std::string::npos) << e.what();
  }
  EXPECT_THROW(shard_slice(shard_layout(c, {0, 2}), "model.layers.0.mlp.experts.weight"), core::Error);
}

TEST(ShardLayout, TpNeedsTheCudaDeviceAndAPositiveSize) {
  EngineSpec spec;
  spec.tp = 2;
  EXPECT_THROW(make_engine(fixture("llama_tiny"), spec), core::InputError);  // device cpu
  EXPECT_THROW(tp_devices(0), core::InputError);
}

// ---------------------------------------------------------------------------------------------
// Sharded loading

// Rows [r0, r0 + nr) and columns [c0, c0 + nc) of a row-major [rows, cols] tensor.
template <class T>
std::vector<T> block(const std::vector<T>& whole, int64_t cols, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  std::vector<T> out;
  for (int64_t r = r0; r < r0 + nr; ++r)
    out.insert(out.end(), whole.begin() + r * cols + c0, whole.begin() + r * cols + c0 + nc);
  return out;
}

// Each rank's slice of every tensor against the block of the whole tensor that the layout
// rules say it is, with head and row ranges derived here independently of shard_slice.
void expect_slices_match(const WeightSource& w, int world) {
  const LlamaConfig& c = w.config();
  const int64_t d = c.head_dim, h = c.hidden_size, heads_per_rank = c.num_heads / world;
  for (int r = 0; r < world; ++r) {
    const ShardLayout L = shard_layout(c, {r, world});
    const int64_t q0 = r * heads_per_rank;
    const int64_t kv_head = q0 * c.num_kv_heads / c.num_heads;  // the KV head of its first query head
    const int64_t kv_heads = std::max<int64_t>(c.num_kv_heads / world, 1);
    const int64_t i0 = r * c.intermediate_size / world, ni = c.intermediate_size / world;
    const int64_t v_rows = (c.vocab_size + world - 1) / world;
    for (const WeightSpec& s : weight_specs(c)) {
      SCOPED_TRACE(s.name + " rank " + std::to_string(r) + " of " + std::to_string(world));
      const std::vector<uint16_t> whole = w.load_bf16(s.name);
      const int64_t rows = s.shape[0], cols = s.shape.size() > 1 ? s.shape[1] : 1;
      std::vector<uint16_t> want = whole;  // replicated unless a rule below applies
      const std::string& n = s.name;
      if (n.ends_with("q_proj.weight") || n.ends_with("q_proj.bias")) want = block(whole, cols, q0 * d, heads_per_rank * d, 0, cols);
      if (n.find("k_proj") != std::string::npos || n.find("v_proj") != std::string::npos)
        want = block(whole, cols, kv_head * d, kv_heads * d, 0, cols);
      if (n.ends_with("o_proj.weight")) want = block(whole, cols, 0, rows, q0 * d, heads_per_rank * d);
      if (n.ends_with("gate_proj.weight") || n.ends_with("up_proj.weight")) want = block(whole, cols, i0, ni, 0, cols);
      if (n.ends_with("down_proj.weight")) want = block(whole, cols, 0, rows, i0, ni);
      if (n == "lm_head.weight") want = block(whole, cols, r * v_rows, std::min(v_rows, rows - r * v_rows), 0, cols);
      const TensorSlice slice = shard_slice(L, n);
      const std::vector<uint16_t> got = w.load_bf16(n, slice);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(got, want);
      // The float32 path reads the same elements.
      const std::vector<float> got_f32 = w.load_f32(n, slice);
      ASSERT_EQ(got_f32.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(core::float_to_bf16_bits(got_f32[i]), want[i]) << "element " << i;
      const SliceRuns runs = w.slice_runs(n, slice);
      int64_t numel = 1;
      for (int64_t e : runs.shape) numel *= e;
      EXPECT_EQ(numel, static_cast<int64_t>(want.size()));
      EXPECT_EQ(runs.numel(), numel);
      EXPECT_EQ(runs.shape.size(), s.shape.size());
    }
    // The engine's fused q/k/v rows of this rank: its q rows, then its k rows, then its v rows,
    // each the right heads of the whole projection (a head is d consecutive rows).
    const std::string layer = "model.layers.1.self_attn.";
    std::vector<uint16_t> fused;
    for (const char* p : {"q_proj.weight", "k_proj.weight", "v_proj.weight"}) {
      const auto part = w.load_bf16(layer + p, shard_slice(L, layer + p));
      fused.insert(fused.end(), part.begin(), part.end());
    }
    ASSERT_EQ(static_cast<int64_t>(fused.size()), (L.num_heads + 2 * L.num_kv_heads) * d * h);
    const auto q = w.load_bf16(layer + "q_proj.weight"), k = w.load_bf16(layer + "k_proj.weight");
    const auto v = w.load_bf16(layer + "v_proj.weight");
    for (int64_t head = 0; head < L.num_heads; ++head)
      EXPECT_TRUE(std::equal(fused.begin() + head * d * h, fused.begin() + (head + 1) * d * h,
                             q.begin() + (q0 + head) * d * h));
    const int64_t k_at = L.num_heads * d * h, v_at = k_at + L.num_kv_heads * d * h;
    EXPECT_TRUE(std::equal(fused.begin() + k_at, fused.begin() + v_at, k.begin() + kv_head * d * h));
    EXPECT_TRUE(std::equal(fused.begin() + v_at, fused.end(), v.begin() + kv_head * d * h));
  }
}

TEST(ShardedLoading, SlicesAreThePartsOfTheWholeTensors) {
  for (const char* name : {"llama_tiny", "llama_tiny_sharded"})
    for (int world : {1, 2, 4}) {
      SCOPED_TRACE(name);
      expect_slices_match(fixture(name), world);
    }
}

TEST(ShardedLoading, RandomWeightsSliceLikeTheirWholeTensors) {
  const WeightSource w = WeightSource::random(gqa_config(), 11);
  for (int world : {2, 4, 8}) expect_slices_match(w, world);
}

// llama_tiny rewritten in float32 and float16: column slices of other dtypes convert element by
// element from the mapped file.
TEST(ShardedLoading, Float32AndFloat16CheckpointsSliceToo) {
  const fs::path dir = fs::temp_directory_path() / ("gpulab_tp_dtypes_" + std::to_string(::getpid()));
  for (core::DType dt : {core::DType::f32, core::DType::f16}) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* f : {"config.json", "generation_config.json"})
      fs::copy_file(testing::fixture_dir("llama_tiny") / f, dir / f);
    testing::write_converted_weights(dir / "model.safetensors", dt);
    SCOPED_TRACE(core::dtype_name(dt));
    const WeightSource w = WeightSource::from_checkpoint(dir);
    const ShardLayout L = shard_layout(w.config(), {1, 2});
    for (const char* n : {"model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight",
                          "model.layers.0.self_attn.k_proj.weight", "lm_head.weight"}) {
      const std::vector<float> whole = w.load_f32(n);
      const std::vector<float> got = w.load_f32(n, shard_slice(L, n));
      const int64_t cols = w.spec(n).shape[1];
      const TensorSlice s = shard_slice(L, n);
      const std::vector<float> want = s.dim == 0 ? block(whole, cols, s.begin, s.count, 0, cols)
                                                 : block(whole, cols, 0, w.spec(n).shape[0], s.begin, s.count);
      EXPECT_EQ(got, want) << n;
    }
  }
  fs::remove_all(dir);
}

TEST(ShardedLoading, SlicesOutsideTheTensorAreRefused) {
  const WeightSource w = fixture("llama_tiny");
  EXPECT_THROW(w.load_f32("lm_head.weight", {0, 1000, 100}), core::Error);
  EXPECT_THROW(w.load_f32("lm_head.weight", {1, 0, 129}), core::Error);
  EXPECT_THROW(w.load_f32("model.norm.weight", {1, 0, 1}), core::Error);
  EXPECT_THROW(w.load_bf16("lm_head.weight", {2, 0, 1}), core::Error);
  EXPECT_EQ(w.load_bf16("lm_head.weight", {1, 5, 0}).size(), 0u);
}

// ---------------------------------------------------------------------------------------------
// Sharded math

// out[t, o] = x[t] · w[o] (+ bias[o]).
std::vector<float> matmul_t(const std::vector<float>& x, int64_t tokens, const std::vector<float>& w,
                            const std::vector<float>& bias, int64_t n, int64_t k) {
  std::vector<float> out(tokens * n);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < n; ++o) {
      float s = bias.empty() ? 0.f : bias[o];
      for (int64_t i = 0; i < k; ++i) s += x[t * k + i] * w[o * k + i];
      out[t * n + o] = s;
    }
  return out;
}

void add_into(std::vector<float>& sum, const std::vector<float>& part) {
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
}

// The tensor-parallel forward with `world` ranks, run one rank after another: each rank holds
// only what sharded loading gives it and its own KV cache; the host sums the row-parallel
// partials (the all-reduces) and places each rank's vocab rows (the gather).
class ShardedCpuModel {
 public:
  ShardedCpuModel(const WeightSource& w, int world) : cfg_(w.config()) {
    inv_freq_ = rope_inv_freq(cfg_.rope, cfg_.head_dim, cfg_.dtype);
    for (int r = 0; r < world; ++r) {
      Rank R;
      R.layout = shard_layout(cfg_, {r, world});
      auto load = [&](const std::string& name) { return w.load_f32(name, shard_slice(R.layout, name)); };
      R.embed = load("model.embed_tokens.weight");
      R.final_norm = load("model.norm.weight");
      const std::string head = cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
      R.lm_head = w.load_f32(head, shard_slice(R.layout, "lm_head.weight"));
      for (int64_t l = 0; l < cfg_.num_layers; ++l) {
        auto layer = [&](const std::string& suffix) { return load(layer_weight(l, suffix)); };
        RankLayer L;
        L.attn_norm = layer("input_layernorm.weight");
        L.wq = layer("self_attn.q_proj.weight");
        L.wk = layer("self_attn.k_proj.weight");
        L.wv = layer("self_attn.v_proj.weight");
        if (cfg_.qkv_bias) {
          L.bq = layer("self_attn.q_proj.bias");
          L.bk = layer("self_attn.k_proj.bias");
          L.bv = layer("self_attn.v_proj.bias");
        }
        L.wo = layer("self_attn.o_proj.weight");
        if (cfg_.o_bias && r == 0) L.bo = layer("self_attn.o_proj.bias");  // added once
        L.mlp_norm = layer("post_attention_layernorm.weight");
        L.gate = layer("mlp.gate_proj.weight");
        L.up = layer("mlp.up_proj.weight");
        L.down = layer("mlp.down_proj.weight");
        R.layers.push_back(std::move(L));
      }
      R.k.resize(cfg_.num_layers);
      R.v.resize(cfg_.num_layers);
      ranks_.push_back(std::move(R));
    }
  }

  // Appends `ids` to the KV caches and returns their logits [ids.size(), vocab].
  std::vector<float> forward(std::span<const int32_t> ids) {
    const int64_t T = static_cast<int64_t>(ids.size()), h = cfg_.hidden_size, d = cfg_.head_dim;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    std::vector<int32_t> positions(T);
    for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(length_ + t);
    std::vector<float> x(T * h), xn(T * h);
    for (int64_t t = 0; t < T; ++t) std::copy_n(ranks_[0].embed.data() + ids[t] * h, h, x.data() + t * h);
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
      std::vector<float> sum(T * h, 0.f);  // the all-reduce after o_proj
      for (Rank& R : ranks_) {
        const RankLayer& L = R.layers[l];
        const int64_t heads = R.layout.num_heads, kv_heads = R.layout.num_kv_heads;
        const int64_t qd = heads * d, kvd = kv_heads * d;
        kernels::rmsnorm_ref(xn.data(), x.data(), L.attn_norm.data(), T, h, eps);
        std::vector<float> q = matmul_t(xn, T, L.wq, L.bq, qd, h);
        std::vector<float> k = matmul_t(xn, T, L.wk, L.bk, kvd, h);
        const std::vector<float> v = matmul_t(xn, T, L.wv, L.bv, kvd, h);
        kernels::rope_ref(q.data(), qd, heads, positions.data(), inv_freq_.data(), T, d);
        kernels::rope_ref(k.data(), kvd, kv_heads, positions.data(), inv_freq_.data(), T, d);
        R.k[l].insert(R.k[l].end(), k.begin(), k.end());
        R.v[l].insert(R.v[l].end(), v.begin(), v.end());
        std::vector<float> attn(T * qd);
        const kernels::AttentionShape shape{heads, kv_heads, d, 1.0f / std::sqrt(static_cast<float>(d))};
        kernels::attention_ref(attn.data(), qd, q.data(), qd, R.k[l].data(), R.v[l].data(), kvd, T, length_, shape);
        add_into(sum, matmul_t(attn, T, L.wo, L.bo, h, qd));
      }
      add_into(x, sum);
      std::fill(sum.begin(), sum.end(), 0.f);  // the all-reduce after down_proj
      for (Rank& R : ranks_) {
        const RankLayer& L = R.layers[l];
        const int64_t inter = R.layout.intermediate;
        kernels::rmsnorm_ref(xn.data(), x.data(), L.mlp_norm.data(), T, h, eps);
        const std::vector<float> gate = matmul_t(xn, T, L.gate, {}, inter, h), up = matmul_t(xn, T, L.up, {}, inter, h);
        std::vector<float> gate_up(T * 2 * inter), act(T * inter);
        for (int64_t t = 0; t < T; ++t) {
          std::copy_n(gate.data() + t * inter, inter, gate_up.data() + t * 2 * inter);
          std::copy_n(up.data() + t * inter, inter, gate_up.data() + t * 2 * inter + inter);
        }
        kernels::silu_mul_ref(act.data(), gate_up.data(), T, inter);
        add_into(sum, matmul_t(act, T, L.down, {}, h, inter));
      }
      add_into(x, sum);
    }
    length_ += T;
    const int64_t V = cfg_.vocab_size;
    std::vector<float> logits(T * V, NAN);
    for (Rank& R : ranks_) {  // the gather of vocab-parallel logits
      kernels::rmsnorm_ref(xn.data(), x.data(), R.final_norm.data(), T, h, eps);
      const ShardLayout& S = R.layout;
      const std::vector<float> part = matmul_t(xn, T, R.lm_head, {}, S.vocab_count, h);
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(part.data() + t * S.vocab_count, S.vocab_count, logits.data() + t * V + S.vocab_begin);
    }
    return logits;
  }

 private:
  struct RankLayer {
    std::vector<float> attn_norm, wq, wk, wv, bq, bk, bv, wo, bo, mlp_norm, gate, up, down;
  };
  struct Rank {
    ShardLayout layout;
    std::vector<float> embed, final_norm, lm_head;
    std::vector<RankLayer> layers;
    std::vector<std::vector<float>> k, v;  // per layer [length, kv_dim of the rank]
  };
  LlamaConfig cfg_;
  std::vector<float> inv_freq_;
  std::vector<Rank> ranks_;
  int64_t length_ = 0;
};

// Sharded logits against the reference: every element finite and within `rtol` of the largest
// logit (1e-4: float32 sums in another order), and the same top-1 at every position.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab, float rtol = 1e-4f) {
  ASSERT_EQ(got.size(), want.size());
  float max_ref = 0.f, max_err = 0.f;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    max_ref = std::max(max_ref, std::abs(want[i]));
    max_err = std::max(max_err, std::abs(got[i] - want[i]));
  }
  EXPECT_GT(max_ref, 0.f);
  EXPECT_LE(max_err, rtol * max_ref) << "max abs error " << max_err << ", max |logit| " << max_ref;
  for (size_t r = 0; r < want.size() / vocab; ++r)
    EXPECT_EQ(argmax(std::span(got).subspan(r * vocab, vocab)), argmax(std::span(want).subspan(r * vocab, vocab)))
        << "position " << r;
}

// Prompt logits, then 8 greedy steps decoded one token at a time through the ranks' caches,
// each step's logits against the reference's.
void expect_sharded_matches_reference(const WeightSource& w, int world, std::span<const int32_t> prompt) {
  SCOPED_TRACE("TP " + std::to_string(world));
  const CpuModel reference(w, 2);
  auto cache = reference.new_cache();
  ShardedCpuModel sharded(w, world);
  const int64_t V = w.config().vocab_size;
  std::vector<float> want = reference.forward(prompt, cache);
  std::vector<float> got = sharded.forward(prompt);
  expect_close(got, want, V);
  for (int step = 0; step < 8; ++step) {
    const int32_t next[1] = {argmax(std::span(want).last(V))};
    want = reference.forward(next, cache);
    got = sharded.forward(next);
    expect_close(got, want, V);
  }
}

class ShardedMathFixture : public ::testing::TestWithParam<std::string> {};

// llama_tiny has 4 heads and 2 KV heads: TP 2 splits the KV heads, TP 4 replicates them.
TEST_P(ShardedMathFixture, MatchesUnshardedReference) {
  const WeightSource w = fixture(GetParam());
  const auto cases = testing::load_fixture_cases(GetParam());
  ASSERT_FALSE(cases.empty());
  for (int world : {1, 2, 4}) {
    ShardedCpuModel sharded(w, world);
    const std::vector<float> got = sharded.forward(cases[0].ids);
    // transformers' float32 logits, at the CPU reference's own bar against them
    expect_close(got, cases[0].logits, w.config().vocab_size, 1e-3f);
    expect_sharded_matches_reference(w, world, cases.back().ids);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ShardedMathFixture, ::testing::Values("llama_tiny", "llama_tiny_sharded"));

// TP 2, 4 and 8 of a GQA model with 2 KV heads (replicated on 2 and 4 ranks), biases, tied
// embeddings and an uneven vocabulary.
TEST(ShardedMath, GqaWithFewerKvHeadsThanRanksMatchesReference) {
  const WeightSource w = WeightSource::random(gqa_config(), 5);
  const std::vector<int32_t> prompt = {7, 1002, 0, 513, 44, 999, 250, 3, 3, 871, 126, 127};
  for (int world : {2, 4, 8}) expect_sharded_matches_reference(w, world, prompt);
}

// ---------------------------------------------------------------------------------------------
// Across processes: the leader's messages

TEST(TpMessage, RoundTripsCallsStepsLogitsAndStop) {
  TpMessage step;
  step.calls = {{40, 1}, {17, 2}, {0, 1}, {5, 3}};
  step.kind = TpMessage::Kind::step;
  step.seqs = {2, 3};
  step.chunks = {{9, 1023, 0, 77}, {5}};
  TpMessage logits;
  logits.kind = TpMessage::Kind::logits;
  logits.chunks = {{1, 2, 3}};
  TpMessage stop;  // no calls, no chunks
  for (const TpMessage& m : {step, logits, stop}) {
    const TpMessage back = decode(encode(m));
    EXPECT_EQ(back.kind, m.kind);
    ASSERT_EQ(back.calls.size(), m.calls.size());
    for (size_t i = 0; i < m.calls.size(); ++i) {
      EXPECT_EQ(back.calls[i].max_tokens, m.calls[i].max_tokens);
      EXPECT_EQ(back.calls[i].seq, m.calls[i].seq);
    }
    EXPECT_EQ(back.seqs, m.seqs);
    EXPECT_EQ(back.chunks, m.chunks);
  }
  std::vector<int64_t> words = encode(step);
  EXPECT_THROW(decode(std::span(words).first(words.size() - 1)), core::Error);  // cut short
  words.push_back(4);
  EXPECT_THROW(decode(words), core::Error);  // a word left over
  words = encode(step);
  words[1 + 2 * 4] = 9;  // the kind
  EXPECT_THROW(decode(words), core::Error);
  EXPECT_THROW(decode(std::vector<int64_t>{}), core::Error);
}

}  // namespace
}  // namespace gpulab::llm
