// The CUDA engine with fp8 linear layers (--weights fp8) against the bf16 engine: logits on the
// fixtures (relative L2 and top-1, every flip an fp8 near tie), greedy tokens (each one an fp8
// near-argmax of the bf16 logits), an fp8 checkpoint giving the logits of quantizing at load bit
// for bit, batch independence and CUDA graphs, and the memory: half the weight bytes, the
// difference going to the KV cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/gpu.h"
#include "llm/cuda_engine.h"
#include "llm/fixtures.h"
#include "llm/fp8_testing.h"
#include "llm/seven_b_shape.h"

namespace gpulab::llm {
namespace {

constexpr int64_t V = 1024;

EngineOptions options(WeightFormat w, Fp8ActivationScale a = Fp8ActivationScale::token) {
  EngineOptions opt;
  opt.max_kv_tokens = 1 << 16;  // a modest pool, so several engines live at once
  opt.weights = w;
  opt.fp8_activations = a;
  return opt;
}

WeightSource tiny() { return WeightSource::from_checkpoint(testing::fixture_dir("llama_tiny")); }

// fp8 against bf16 logits over the five llama_tiny cases (235 positions). On this random-weight
// fixture fp8 weights alone (float32 math, tests/llm/test_fp8_weights.cpp) give 6.1 % rel L2 and
// 85.5 % top-1 against the float32 logits, every flip within 5.4e-2 of the top logit; with the
// activations quantized too (emulated in float32 on the CPU) 8.4 % and 86.4 % per token, 8.8 %
// and 84.7 % per tensor, flips within 7.6e-2. The 95 % bar is out of reach on this
// fixture; it holds (100 %) on the positions that are not fp8 near ties.
testing::Fp8Agreement expect_near_bf16(CudaEngine& fp8, CudaEngine& bf16, const char* what) {
  testing::Fp8Agreement a, fixture;
  for (const auto& c : testing::load_fixture_cases("llama_tiny")) {
    const std::vector<float> got = fp8.logits(c.ids);
    a.add(got, bf16.logits(c.ids), V);
    fixture.add(got, c.logits, V);
  }
  a.print((std::string(what) + " vs the bf16 engine").c_str());
  fixture.print((std::string(what) + " vs the float32 fixture").c_str());
  EXPECT_TRUE(a.finite);
  EXPECT_LT(a.rel_l2(), 0.12);
  EXPECT_GE(double(a.agree) / a.rows, 0.8);
  EXPECT_GE(double(a.decided_agree) / a.decided, 0.95);
  EXPECT_LE(a.worst_flip, 0.125f) << "a flip outside an fp8 near tie";
  return a;
}

class Fp8EngineFixture : public ::testing::TestWithParam<std::tuple<std::string, Fp8ActivationScale>> {};

TEST_P(Fp8EngineFixture, LogitsNearTheBf16Engine) {
  GPULAB_REQUIRE_GPU();
  const auto& [fixture, act] = GetParam();
  const WeightSource src = WeightSource::from_checkpoint(testing::fixture_dir(fixture));
  CudaEngine bf16(src, options(WeightFormat::bf16));
  CudaEngine fp8(src, options(WeightFormat::fp8, act));
  expect_near_bf16(fp8, bf16, act == Fp8ActivationScale::token ? "fp8, per-token activations"
                                                                : "fp8, per-tensor activations");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8EngineFixture,
                         ::testing::Combine(::testing::Values("llama_tiny", "llama_tiny_sharded"),
                                            ::testing::Values(Fp8ActivationScale::token, Fp8ActivationScale::tensor)));

// An fp8 checkpoint with per-channel fp32 scales holds exactly what the engine makes when it
// quantizes the bf16 checkpoint at load: the logits must be identical bit for bit. The mixed
// checkpoint (per-tensor scales for q/k, bf16 scales for v) must land as near the bf16 engine.
TEST(Fp8Engine, Fp8CheckpointsLoad) {
  GPULAB_REQUIRE_GPU();
  const testing::ScratchDir per_channel("fp8_engine"), mixed("fp8_engine");
  testing::write_fp8_fixture(per_channel.path(), testing::Fp8ScaleLayout::per_channel);
  testing::write_fp8_fixture(mixed.path(), testing::Fp8ScaleLayout::mixed);
  CudaEngine at_load(tiny(), options(WeightFormat::fp8));
  CudaEngine stored(WeightSource::from_checkpoint(per_channel.path()), options(WeightFormat::fp8));
  for (const auto& c : testing::load_fixture_cases("llama_tiny")) {
    const std::vector<float> a = at_load.logits(c.ids), b = stored.logits(c.ids);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "fp8 checkpoint differs from quantizing at load";
  }
  CudaEngine bf16(tiny(), options(WeightFormat::bf16));
  CudaEngine from_mixed(WeightSource::from_checkpoint(mixed.path()), options(WeightFormat::fp8));
  expect_near_bf16(from_mixed, bf16, "fp8 checkpoint with mixed scales");
  // The bf16 engine reads an fp8 checkpoint too (dequantized at load).
  CudaEngine dequantized(WeightSource::from_checkpoint(per_channel.path()), options(WeightFormat::bf16));
  expect_near_bf16(dequantized, bf16, "bf16 engine on the fp8 checkpoint");
}

// Greedy decoding of `prompts` together through Engine::step (prefill each, then decode steps of
// all sequences at once).
std::vector<std::vector<int32_t>> greedy_steps(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                               int64_t max_new) {
  std::vector<SeqId> seqs;
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<float> logits(prompts.size() * V);
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs.push_back(*engine.open(static_cast<int64_t>(prompts[i].size()) + max_new));
    const std::span<const int32_t> chunk[1] = {prompts[i]};
    engine.step(std::span(&seqs[i], 1), chunk, std::span(logits.data() + i * V, V));
  }
  for (int64_t t = 0; t < max_new; ++t) {
    std::vector<std::span<const int32_t>> chunks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const float* row = logits.data() + i * V;
      out[i].push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
      chunks.push_back(std::span(&out[i].back(), 1));
    }
    if (t + 1 < max_new) engine.step(seqs, chunks, logits);
  }
  for (SeqId s : seqs) engine.close(s);
  return out;
}

std::vector<std::vector<int32_t>> prompts() {
  std::vector<std::vector<int32_t>> p;
  for (const auto& c : testing::load_fixture_cases("llama_tiny")) p.push_back(c.ids);
  std::mt19937 rng(9);
  while (p.size() < 12) {
    std::vector<int32_t> ids(std::uniform_int_distribution<int>(1, 60)(rng));
    for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, V - 1)(rng);
    p.push_back(ids);
  }
  return p;
}

// Per-token activation scales keep a sequence independent of its batch: 12 together through
// the decode graph equal each alone, and equal the eager (graph-free) engine. Every greedy token
// is an fp8 near-argmax of the bf16 engine's logits given the fp8 prefix.
TEST(Fp8Engine, GreedyIsBatchIndependentAndFollowsBf16UpToNearTies) {
  GPULAB_REQUIRE_GPU();
  const WeightSource src = tiny();
  CudaEngine fp8(src, options(WeightFormat::fp8));
  CudaEngine bf16(src, options(WeightFormat::bf16));
  const auto p = prompts();
  const int64_t n = 16;
  const auto together = greedy_steps(fp8, p, n);
  // Under racecheck (under_racecheck) no eager engine, and three prompts alone: the eager launches
  // and the other prompts alone run the same kernels again, and an eager decode step takes seconds.
  if (!under_racecheck()) {
    EngineOptions eager_opt = options(WeightFormat::fp8);
    eager_opt.cuda_graphs = false;
    CudaEngine eager(src, eager_opt);
    EXPECT_EQ(greedy_steps(eager, p, n), together) << "CUDA graph replay differs from eager launches";
  }
  const size_t alone = under_racecheck() ? 3 : p.size();
  const auto bf16_tokens = greedy_steps(bf16, p, n);
  int64_t same_prefix = 0, flips = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (i < alone) {
      EXPECT_EQ(greedy_steps(fp8, {p[i]}, n)[0], together[i]) << "prompt " << i << " alone differs from batched";
    }
    size_t k = 0;
    while (k < together[i].size() && together[i][k] == bf16_tokens[i][k]) ++k;
    same_prefix += static_cast<int64_t>(k);
    std::vector<int32_t> ids = p[i];
    ids.insert(ids.end(), together[i].begin(), together[i].end() - 1);
    const std::vector<float> ref = bf16.logits(ids);
    for (int64_t t = 0; t < n; ++t) {
      const float* row = ref.data() + (p[i].size() - 1 + t) * V;
      const float top = *std::max_element(row, row + V), mine = row[together[i][t]];
      flips += mine != top;
      EXPECT_LE(top - mine, std::ldexp(std::fabs(top), -3)) << "prompt " << i << " token " << t << ": not a near tie";
    }
  }
  std::printf("fp8 greedy: %lld of %lld tokens before the first divergence from bf16 greedy; %lld of %lld tokens "
              "not the bf16 argmax given the fp8 prefix\n",
              (long long)same_prefix, (long long)(n * p.size()), (long long)flips, (long long)(n * p.size()));
  EXPECT_LE(flips, n * static_cast<int64_t>(p.size()) / 4);  // ~15 % of the fixture positions are fp8 near ties
}

// Neither the order engines are built in nor CUDA graphs may change results: an engine without
// graphs built first, one with graphs built next and one without graphs built after that one
// replayed its decode graph give bit-identical prefill logits and the same greedy tokens. Which
// check fails tells apart a graph replay that differs, engines that differ from the start, and
// an engine spoiled by another's replays.
TEST(Fp8Engine, EngineOrderAndCudaGraphsDoNotChangeResults) {
  GPULAB_REQUIRE_GPU();
  const WeightSource src = tiny();
  EngineOptions eager_opt = options(WeightFormat::fp8);
  eager_opt.cuda_graphs = false;
  const auto cases = testing::load_fixture_cases("llama_tiny");
  const auto p = prompts();
  const int64_t n = 16;
  CudaEngine first(src, eager_opt);
  std::vector<std::vector<float>> ref;
  for (const auto& c : cases) ref.push_back(first.logits(c.ids));
  const auto tokens = greedy_steps(first, p, n);
  const auto same_logits = [&](CudaEngine& engine, const std::string& what) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::vector<float> got = engine.logits(cases[i].ids);
      ASSERT_EQ(got.size(), ref[i].size());
      EXPECT_EQ(std::memcmp(got.data(), ref[i].data(), got.size() * 4), 0) << what << ": prefill logits of case " << i;
    }
  };
  CudaEngine graphs(src, options(WeightFormat::fp8));
  same_logits(graphs, "the graph engine built second, before its first step");
  EXPECT_EQ(greedy_steps(graphs, p, n), tokens) << "CUDA graph replay differs from the eager engine built first";
  CudaEngine later(src, eager_opt);
  same_logits(later, "an eager engine built after the graph engine replayed");
  EXPECT_EQ(greedy_steps(later, p, n), tokens) << "an eager engine built after the graph engine replayed";
  same_logits(first, "the first engine, after the others ran");
}

// A random LLaMA-2-7B shape: fp8 weights take half the bytes (one per parameter plus a scale
// per row), the KV pool grows by what they free, and the logits stay near bf16's. Under racecheck
// 2 layers (seven_b_shape), whose KV cache fits in max_batch · max_seq_len tokens: the pool is then
// bounded by that, not by memory, and its growth is not judged there.
TEST(Fp8Engine, SevenBShapeHalvesWeightBytesAndGrowsTheKvPool) {
  GPULAB_REQUIRE_GPU();
  const LlamaConfig cfg = testing::seven_b_shape(2);
  const WeightSource src = WeightSource::random(cfg, 3);
  EngineOptions opt;
  opt.gpu_memory_fraction = 0.4;  // 56 GB: the pool is bounded by memory, not by max_batch · max_seq_len
  std::vector<int32_t> ids(64);
  std::mt19937 rng(4);
  for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, 31999)(rng);
  CudaEngine::Capacity cap[2];
  std::vector<float> logits[2];
  for (int i = 0; i < 2; ++i) {
    opt.weights = i ? WeightFormat::fp8 : WeightFormat::bf16;
    CudaEngine engine(src, opt);
    cap[i] = engine.capacity();
    logits[i] = engine.logits(ids);
  }
  const int64_t h = cfg.hidden_size, layer_params = (cfg.q_dim() + 2 * cfg.kv_dim()) * h + h * cfg.q_dim() +
                                                    3 * cfg.intermediate_size * h;
  const int64_t layer_rows = cfg.q_dim() + 2 * cfg.kv_dim() + h + 2 * cfg.intermediate_size + h;
  const int64_t saved = cfg.num_layers * (layer_params - 4 * layer_rows);  // 2 bytes -> 1, plus scales
  std::printf("7B shape: weights %.2f GiB bf16, %.2f GiB fp8; KV %.2f GiB bf16, %.2f GiB fp8 (%lld / %lld pages)\n",
              cap[0].weight_bytes / 1073741824.0, cap[1].weight_bytes / 1073741824.0, cap[0].kv_bytes / 1073741824.0,
              cap[1].kv_bytes / 1073741824.0, (long long)cap[0].kv_blocks, (long long)cap[1].kv_blocks);
  EXPECT_NEAR(double(cap[0].weight_bytes - cap[1].weight_bytes), double(saved), 256.0 * 8 * cfg.num_layers);
  // The KV pool gains what the weights freed, less the fp8 activation buffers, less what the rest
  // of the GPU took meanwhile (ctest runs several test programs on it at once): both pools are the
  // budget less the memory in use when they were sized, to within a page each.
  const double freed = double(cap[0].weight_bytes) - double(cap[1].weight_bytes) -
                       (double(cap[1].buffer_bytes) - double(cap[0].buffer_bytes));
  const auto others = [&](int i) {
    return double(cap[i].in_use_bytes) - double(cap[i].weight_bytes) - double(cap[i].buffer_bytes);
  };
  std::printf("freed by fp8 %.2f GiB, taken meanwhile by the rest of the GPU %.2f GiB\n", freed / 1073741824.0,
              (others(1) - others(0)) / 1073741824.0);
  const double page_bytes = double(cap[0].kv_bytes) / double(cap[0].kv_blocks);
  if (!under_racecheck()) {
    EXPECT_NEAR(double(cap[1].kv_bytes) - double(cap[0].kv_bytes), freed - (others(1) - others(0)), 2 * page_bytes);
  }
  testing::Fp8Agreement a;
  a.add(logits[1], logits[0], cfg.vocab_size);
  a.print("random 7B shape, fp8 vs bf16");
  EXPECT_TRUE(a.finite);
  // Reported, loosely bounded: measured 0.58 on the H200 (top-1 15/64). Random weights of std 0.02
  // give each 7B layer a gain above 1 (0.02·√11008 ≈ 2.1 in down_proj), so 32 layers amplify fp8's
  // rounding noise far more than a trained model would; the fixtures carry the accuracy bar.
  EXPECT_LT(a.rel_l2(), 0.9);
}

}  // namespace
}  // namespace gpulab::llm
