// The CUDA engine against the transformers fixtures and against itself: logits within the bf16
// tolerance of the float32 reference, the sharded checkpoint bit-identical to the single file,
// chunked and multi-pass prefill, greedy decoding through the scheduler independent of batching
// (and leaving float32 greedy only at near ties), and requests that cannot fit refused clearly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <stdexcept>

#include "common/gpu.h"
#include "core/error.h"
#include "core/env.h"
#include "kernels/skinny_gemm.h"
#include "llm/cpu_model.h"
#include "llm/cuda_engine.h"
#include "llm/fixtures.h"
#include "llm/fp8_testing.h"
#include "llm/hf_reference.h"
#include "llm/near_tie.h"
#include "llm/scheduler.h"
#include "llm/tokenizer.h"

namespace gpulab::llm {
namespace {

using testing::Agreement;
using testing::compare_logits;
using testing::fp32_gap;
using testing::hf_reference;
using testing::HfReference;
using testing::near_tie;
using testing::top1;

// Engines in these tests keep a modest KV pool, so several can live at once.
EngineOptions modest(EngineOptions opt = {}) {
  if (opt.max_kv_tokens == 0) opt.max_kv_tokens = 1 << 16;
  return opt;
}

WeightSource tiny() { return WeightSource::from_checkpoint(testing::fixture_dir("llama_tiny")); }

// Engine logits against the fixture's float32 ones: relative L2 per case, and top-1 agreement
// over all positions, printed beside what transformers' own bf16 forward achieves. Each
// disagreement is listed with the float32 margin, so a near tie is told from a bug.
void expect_near_fixture(CudaEngine& engine, const std::string& fixture) {
  constexpr int64_t V = 1024;
  const auto cases = testing::load_fixture_cases(fixture);
  int64_t rows = 0, agree = 0, agree_transformers = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<float> got = engine.logits(cases[i].ids);
    ASSERT_EQ(got.size(), cases[i].logits.size()) << "case " << i;
    const Agreement a = compare_logits(got, cases[i].logits, V);
    const Agreement t = compare_logits(cases[i].logits_bf16, cases[i].logits, V);
    EXPECT_LE(a.rel_l2, 2e-2) << "case " << i;
    rows += a.rows;
    agree += a.top1_agree;
    agree_transformers += t.top1_agree;
    std::printf("%s case %zu: rel L2 %.2e, top-1 %lld/%lld (transformers bf16: rel L2 %.2e, top-1 %lld/%lld)\n",
                fixture.c_str(), i, a.rel_l2, (long long)a.top1_agree, (long long)a.rows, t.rel_l2,
                (long long)t.top1_agree, (long long)t.rows);
    for (int64_t r = 0; r < a.rows; ++r) {
      const float* want = cases[i].logits.data() + r * V;
      const int64_t mine = top1(got.data() + r * V, V), ref = top1(want, V);
      if (mine == ref) continue;
      std::printf("  position %lld: engine %lld, float32 %lld (float32 logits %.4f vs %.4f, margin %.4f), "
                  "transformers bf16 %lld\n",
                  (long long)r, (long long)mine, (long long)ref, want[ref], want[mine], fp32_gap(want, V, mine),
                  (long long)top1(cases[i].logits_bf16.data() + r * V, V));
      EXPECT_TRUE(near_tie(want, V, mine)) << "case " << i << " position " << r << ": not a near tie";
    }
  }
  std::printf("%s: top-1 %lld/%lld (%.1f%%), transformers bf16 %lld/%lld (%.1f%%)\n", fixture.c_str(), (long long)agree,
              (long long)rows, 100.0 * agree / rows, (long long)agree_transformers, (long long)rows,
              100.0 * agree_transformers / rows);
  EXPECT_GE(double(agree) / rows, 0.98) << agree << " of " << rows << " positions agree on top-1";
}

class CudaEngineFixture : public ::testing::TestWithParam<std::string> {};

// Both checkpoints against all five llama_tiny cases (235 positions). llama_tiny_sharded's own
// fixture holds only the first two of them (53 positions): too few for a 98% bar, since at
// 53 one near tie is 1.9% and transformers' own bf16 forward flips two of them (51/53).
TEST_P(CudaEngineFixture, LogitsMatchTransformersFp32) {
  GPULAB_REQUIRE_GPU();
  CudaEngine engine(WeightSource::from_checkpoint(testing::fixture_dir(GetParam())), modest());
  expect_near_fixture(engine, "llama_tiny");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaEngineFixture, ::testing::Values("llama_tiny", "llama_tiny_sharded"));

// The bar (relative L2 2e-2) and, since a random model's top two logits are often
// closer than bf16 rounding moves them (transformers' own bf16 forward flipped 3 of 64 against
// float32 in session 7), each top-1 disagreement must be a near tie, as on the fixtures, and
// the engine must be no further from float64 than transformers' bf16 forward is.
TEST(CudaEngine, RandomSevenBCheckpointMatchesTransformers) {
  GPULAB_REQUIRE_GPU();
  const std::optional<HfReference> ref = hf_reference();
  if (!ref) GTEST_SKIP() << "GPULAB_HF_REFERENCE_DIR is not set (run tests/reference/hf_llama_random.py first)";
  CudaEngine engine(WeightSource::from_checkpoint(std::getenv("GPULAB_HF_REFERENCE_DIR")), modest());
  const int64_t V = engine.config().vocab_size;
  ASSERT_EQ(ref->logits.size(), ref->ids.size() * static_cast<size_t>(V));
  const std::vector<float> got = engine.logits(ref->ids);
  const Agreement a = compare_logits(got, ref->logits, V);
  const Agreement t = compare_logits(ref->logits_bf16, ref->logits, V);
  std::printf("random 7B checkpoint vs transformers float64: rel L2 %.2e, top-1 %lld/%lld (transformers bf16: rel "
              "L2 %.2e, top-1 %lld/%lld)\n", a.rel_l2, (long long)a.top1_agree, (long long)a.rows, t.rel_l2,
              (long long)t.top1_agree, (long long)t.rows);
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* want = ref->logits.data() + r * V;
    const int64_t mine = top1(got.data() + r * V, V), exact = top1(want, V);
    if (mine == exact) continue;
    std::printf("  position %lld: engine %lld, float64 %lld (margin %.4f of %.4f), transformers bf16 %lld\n",
                (long long)r, (long long)mine, (long long)exact, fp32_gap(want, V, mine), want[exact],
                (long long)top1(ref->logits_bf16.data() + r * V, V));
    EXPECT_TRUE(near_tie(want, V, mine)) << "position " << r << ": not a near tie";
  }
  EXPECT_LE(a.rel_l2, 2e-2);
  EXPECT_LE(a.rel_l2, t.rel_l2);
}

// The sharded checkpoint holds the same bytes as the single file: the engine's logits must be
// identical bit for bit (a loading-order bug or nondeterminism would show here).
TEST(CudaEngine, ShardedCheckpointGivesTheLogitsOfTheSingleFile) {
  GPULAB_REQUIRE_GPU();
  CudaEngine single(tiny(), modest());
  CudaEngine sharded(WeightSource::from_checkpoint(testing::fixture_dir("llama_tiny_sharded")), modest());
  const auto cases = testing::load_fixture_cases("llama_tiny");
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<float> a = single.logits(cases[i].ids), b = sharded.logits(cases[i].ids);
    ASSERT_EQ(a.size(), b.size());
    size_t differ = 0, first = a.size();
    for (size_t j = 0; j < a.size(); ++j)
      if (std::memcmp(&a[j], &b[j], sizeof(float)) != 0 && differ++ == 0) first = j;
    EXPECT_EQ(differ, 0u) << "case " << i << ": " << differ << " logits differ, first at position " << first / 1024
                          << " token " << first % 1024 << " (" << a[first] << " vs " << b[first] << ")";
    EXPECT_EQ(a, single.logits(cases[i].ids)) << "case " << i << ": a second run differs";
  }
}

TEST(CudaEngine, MultiPassPrefillMatchesTheFixtureToo) {
  GPULAB_REQUIRE_GPU();
  EngineOptions opt;
  opt.max_step_tokens = 16;  // the 141-token prompt runs in 9 passes, each over the cached past
  opt.max_batch = 4;
  CudaEngine engine(tiny(), modest(opt));
  expect_near_fixture(engine, "llama_tiny");
}

TEST(CudaEngine, ChunkedStepsGiveTheLogitsOfOneForward) {
  GPULAB_REQUIRE_GPU();
  CudaEngine engine(tiny(), modest());
  const auto cases = testing::load_fixture_cases("llama_tiny");
  const std::vector<int32_t>& ids = cases[4].ids;  // 141 tokens
  const std::vector<float> full = engine.logits(ids);
  const int64_t V = 1024, T = static_cast<int64_t>(ids.size());
  const std::vector<float> last(full.end() - V, full.end());
  // Chunks of 1, 7, 64 and the rest: single-token steps take the decode path.
  const auto seq = engine.open(T);
  ASSERT_TRUE(seq);
  std::vector<float> logits(V);
  size_t fed = 0;
  for (size_t n : {size_t{1}, size_t{7}, size_t{64}, ids.size() - 72}) {
    const SeqId s[1] = {*seq};
    const std::span<const int32_t> chunk[1] = {std::span(ids).subspan(fed, n)};
    engine.step(s, chunk, logits);
    fed += n;
  }
  engine.close(*seq);
  const Agreement a = compare_logits(logits, last, V);
  EXPECT_LE(a.rel_l2, 5e-3);
  EXPECT_EQ(a.top1_agree, 1);
  EXPECT_EQ(engine.kv_free_tokens(), engine.capacity().kv_blocks * engine.capacity().block_size);  // every page back
}

// pack_chunks: the prompt chunks of a step share passes (at most max_step_tokens rows each), a
// sequence's pieces never in one pass. Chunks of 141 (64 + 64 + 13), 20, 30, 65 (64 + 1) and 9
// tokens beside one decode: one pass a piece and the decode pass (9) unpacked; packed, the
// decode pass then [64] [64] [13 20 30] [64] [1 9] (6). The logits agree within bf16 rounding
// with the unpacked ones and with float32, in this step and in a decode step after it (so the
// packed passes wrote every sequence's KV cache where it belongs).
TEST(CudaEngine, PackedChunksMatchOnePassPerChunk) {
  GPULAB_REQUIRE_GPU();
  constexpr int64_t V = 1024;
  const auto source = tiny();
  const CpuModel cpu(source);
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t len : {5, 141, 20, 30, 65, 9}) {  // the first is fed before and then decodes
    std::vector<int32_t> ids(len + 1);
    for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, V - 1)(rng);
    prompts.push_back(ids);
  }
  struct Run {
    std::vector<float> chunk_step, decode_step;
    int64_t passes = 0;
  };
  const auto run = [&](bool pack) {
    EngineOptions opt;
    opt.max_step_tokens = 64;
    opt.pack_chunks = pack;
    CudaEngine engine(source, modest(opt));
    std::vector<SeqId> seqs;
    for (const auto& p : prompts) seqs.push_back(*engine.open(static_cast<int64_t>(p.size())));
    std::vector<float> scratch(V);
    const std::span<const int32_t> first[1] = {std::span(prompts[0]).first(prompts[0].size() - 2)};
    engine.step(std::span(seqs).first(1), first, scratch);
    Run r;
    std::vector<std::span<const int32_t>> chunks = {std::span(prompts[0]).subspan(prompts[0].size() - 2, 1)};
    for (size_t i = 1; i < prompts.size(); ++i) chunks.push_back(std::span(prompts[i]).first(prompts[i].size() - 1));
    r.chunk_step.resize(prompts.size() * V);
    const int64_t before = engine.forward_passes();
    engine.step(seqs, chunks, r.chunk_step);
    r.passes = engine.forward_passes() - before;
    chunks.clear();
    for (const auto& p : prompts) chunks.push_back(std::span(p).last(1));
    r.decode_step.resize(prompts.size() * V);
    engine.step(seqs, chunks, r.decode_step);
    for (SeqId s : seqs) engine.close(s);
    EXPECT_EQ(engine.kv_free_tokens(), engine.capacity().kv_blocks * engine.capacity().block_size);
    return r;
  };
  const Run packed = run(true), alone = run(false);
  EXPECT_EQ(alone.passes, 9);
  EXPECT_EQ(packed.passes, 6);
  const auto row_of = [&](const std::vector<float>& all, size_t r) {
    return std::vector<float>(all.begin() + r * V, all.begin() + (r + 1) * V);
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<float> fp32 = cpu.logits(prompts[i]);
    const size_t T = prompts[i].size();
    for (const auto& [name, field, row] :
         {std::tuple{"chunk step", &Run::chunk_step, T - 2}, std::tuple{"decode step", &Run::decode_step, T - 1}}) {
      const std::vector<float> mine = row_of(packed.*field, i);
      const Agreement a = compare_logits(mine, row_of(alone.*field, i), V), f = compare_logits(mine, row_of(fp32, row), V);
      std::printf("prompt %zu %s: packed vs one pass a chunk rel L2 %.2e; vs float32 %.2e\n", i, name, a.rel_l2,
                  f.rel_l2);
      EXPECT_LE(a.rel_l2, 5e-3) << "prompt " << i << " " << name;
      EXPECT_LE(f.rel_l2, 2e-2) << "prompt " << i << " " << name;
    }
  }
}

// Greedy continuations through the scheduler (continuous batching), stop tokens ignored.
std::vector<std::vector<int32_t>> greedy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                         int64_t max_new, SchedulerOptions options = {}) {
  static const Tokenizer tokenizer = Tokenizer::from_file(testing::fixture_dir("llama_tiny") / "tokenizer.json");
  Scheduler scheduler(engine, tokenizer, options);
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.max_new_tokens = max_new;
    r.stop_at_eos = false;
    r.on_done = [&out, i](const GenerationResult& g) { out[i] = g.tokens; };
    scheduler.submit(std::move(r));
  }
  scheduler.run_until_idle();
  return out;
}

std::vector<std::vector<int32_t>> one_at_a_time(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                int64_t max_new, SchedulerOptions options = {}) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) out.push_back(greedy(engine, {p}, max_new, options)[0]);
  return out;
}

// 16 different prompts: the fixture prompts and random ones of varied lengths.
std::vector<std::vector<int32_t>> sixteen_prompts() {
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : testing::load_fixture_cases("llama_tiny")) prompts.push_back(c.ids);
  std::mt19937 rng(5);
  while (prompts.size() < 16) {
    std::vector<int32_t> ids(std::uniform_int_distribution<int>(1, 90)(rng));
    for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, 1023)(rng);
    prompts.push_back(ids);
  }
  return prompts;
}

// The first n of `prompts`.
std::vector<std::vector<int32_t>> first(const std::vector<std::vector<int32_t>>& prompts, size_t n) {
  return {prompts.begin(), prompts.begin() + static_cast<std::ptrdiff_t>(std::min(n, prompts.size()))};
}

TEST(CudaEngine, BatchedGreedyEqualsEachAlone) {
  GPULAB_REQUIRE_GPU();
  CudaEngine engine(tiny(), modest());
  const auto prompts = sixteen_prompts();
  const auto batched = greedy(engine, prompts, 24);
  // Under racecheck four prompts alone (under_racecheck): each alone runs the same one-row kernels.
  const auto alone = one_at_a_time(engine, first(prompts, under_racecheck() ? 4 : prompts.size()), 24);
  ASSERT_EQ(batched.size(), 16u);
  for (const auto& tokens : batched) EXPECT_EQ(tokens.size(), 24u);
  for (size_t i = 0; i < alone.size(); ++i) EXPECT_EQ(batched[i], alone[i]) << "request " << i;
  // Beside float32: report how far bf16 greedy follows the fixture's float32 greedy. It may
  // leave it only at a near tie, so every token must be a float32 near-argmax given the
  // engine's own prefix (float32 logits from the CPU reference, checked against the fixtures).
  const auto cases = testing::load_fixture_cases("llama_tiny");
  for (size_t i = 0; i < cases.size(); ++i) {
    size_t same = 0;
    while (same < 24 && batched[i][same] == cases[i].greedy[same]) ++same;
    std::printf("case %zu: first %zu of 24 greedy tokens equal the float32 fixture\n", i, same);
  }
  const CpuModel cpu(tiny());
  for (size_t i = 0; i < prompts.size(); ++i)
    testing::expect_float32_greedy_or_near_tie(cpu, prompts[i], batched[i], "request " + std::to_string(i));
  EXPECT_EQ(engine.kv_free_tokens(), engine.capacity().kv_blocks * engine.capacity().block_size);  // every page back
}

// step_greedy picks on the GPU the token the host picks from step's logits: for prompt chunks,
// and for decodes that follow a chunk in the batch (their pass's rows go through a scratch).
TEST(CudaEngine, GreedyStepPicksTheArgmaxOfTheStepsLogits) {
  GPULAB_REQUIRE_GPU();
  CudaEngine engine(tiny(), modest());
  constexpr int64_t V = 1024, kSteps = 6;
  const auto prompts = sixteen_prompts();
  // Row 0 feeds a 5-token chunk every step; rows 1 and 2 feed back their last token.
  const auto run = [&](bool on_gpu) {
    std::vector<SeqId> seqs;
    for (int i = 0; i < 3; ++i) seqs.push_back(*engine.open(256));
    std::vector<int32_t> tokens(3), chunk0(5);
    std::vector<float> logits(3 * V);
    std::vector<std::vector<int32_t>> picked;
    for (int64_t step = 0; step < kSteps; ++step) {
      for (int64_t t = 0; t < 5; ++t) chunk0[t] = static_cast<int32_t>((step * 37 + t * 11) % V);
      std::vector<std::span<const int32_t>> chunks{chunk0, prompts[1], prompts[2]};
      if (step > 0) chunks = {chunk0, std::span<const int32_t>(&tokens[1], 1), std::span<const int32_t>(&tokens[2], 1)};
      if (on_gpu) {
        engine.step_greedy(seqs, chunks, tokens);
      } else {
        engine.step(seqs, chunks, logits);
        for (int64_t r = 0; r < 3; ++r) tokens[r] = static_cast<int32_t>(top1(logits.data() + r * V, V));
      }
      picked.push_back(tokens);
    }
    for (SeqId id : seqs) engine.close(id);
    return picked;
  };
  const auto host = run(false), gpu = run(true);
  for (int64_t step = 0; step < kSteps; ++step) EXPECT_EQ(gpu[step], host[step]) << "step " << step;
}

TEST(CudaEngine, ContinuousBatchingInASmallPoolWithChunksAndWithoutGraphs) {
  GPULAB_REQUIRE_GPU();
  const auto source = tiny();
  // Under racecheck six prompts (under_racecheck): still twice the slots, so requests still wait.
  const auto prompts = first(sixteen_prompts(), under_racecheck() ? 6 : 16);
  SchedulerOptions chunked;
  chunked.prefill_chunk = 32;
  CudaEngine reference(source, modest());
  const auto alone = one_at_a_time(reference, prompts, 20);
  // A pool of 320 tokens and 3 batch slots: requests wait for pages and slots and start
  // while others decode; prompts are fed 32 tokens per step beside decode tokens.
  EngineOptions small;
  small.max_kv_tokens = 320;
  small.max_batch = 3;
  small.max_seq_len = 256;
  CudaEngine constrained(source, small);
  EXPECT_EQ(constrained.capacity().kv_blocks, 20);
  // Alone on the same engine (the same GEMM shapes: decode passes are max_batch rows).
  const auto alone_chunked = one_at_a_time(constrained, prompts, 20, chunked);
  EXPECT_EQ(greedy(constrained, prompts, 20, chunked), alone_chunked);
  // Chunked or whole prefill, 3 or 64 decode rows: the same tokens but where a near tie
  // rounds the other way.
  int differ = 0;
  for (size_t i = 0; i < prompts.size(); ++i) differ += alone_chunked[i] != alone[i];
  EXPECT_LE(differ, 2);
  EXPECT_EQ(constrained.kv_free_tokens(), 320);
  if (under_racecheck()) return;  // the eager launches run the same kernels, and a step takes seconds
  EngineOptions eager;
  eager.cuda_graphs = false;
  CudaEngine no_graphs(source, modest(eager));
  EXPECT_EQ(greedy(no_graphs, prompts, 20), alone);
}

TEST(CudaEngine, RequestsThatCannotFitAreRefused) {
  GPULAB_REQUIRE_GPU();
  const auto source = tiny();
  EngineOptions opt;
  opt.max_kv_tokens = 64;
  opt.max_seq_len = 128;
  CudaEngine engine(source, opt);
  EXPECT_EQ(engine.kv_capacity_tokens(), 64);
  try {
    greedy(engine, {std::vector<int32_t>(60, 7)}, 10);
    ADD_FAILURE() << "a request larger than the KV pool ran";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the KV cache"), std::string::npos) << e.what();
  }
  try {
    engine.open(129);
    ADD_FAILURE() << "a sequence longer than max_seq_len opened";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the engine's max sequence length 128"), std::string::npos) << e.what();
  }
  // The pool is all reserved by one sequence: a second must wait (nullopt), not fail.
  const auto first = engine.open(64);
  ASSERT_TRUE(first);
  EXPECT_FALSE(engine.open(16));
  engine.close(*first);
  EXPECT_TRUE(engine.open(16));
  EXPECT_THROW(engine.logits(std::vector<int32_t>{1, 1024}), core::InputError);

  EngineOptions tiny_fraction;
  tiny_fraction.gpu_memory_fraction = 1e-4;
  EXPECT_THROW(CudaEngine(source, tiny_fraction), core::InputError);
}

TEST(CudaEngine, RandomWeightsFilledOnTheDeviceMatchTheHostFill) {
  GPULAB_REQUIRE_GPU();
  LlamaConfig cfg = read_model_config(testing::fixture_dir("llama_tiny"));
  cfg.qkv_bias = true;  // also covers the bias path
  const auto source = WeightSource::random(cfg, 3);
  CudaEngine engine(source, modest());
  const CpuModel cpu(source);
  const std::vector<int32_t> ids = {1, 50, 900, 3, 3, 3, 77};
  EXPECT_LE(compare_logits(engine.logits(ids), cpu.logits(ids), cfg.vocab_size).rel_l2, 2e-2);
}


// Decode logits with teacher forcing: each prompt's first half as one prefill step, then the
// rest one token per step, up to max_batch prompts batched. Row p of prompt i: the logits after
// ids[0..p] for p from half - 1 on (the rows before stay zero).
std::vector<std::vector<float>> teacher_forced(CudaEngine& engine, const std::vector<std::vector<int32_t>>& prompts) {
  const int64_t V = engine.config().vocab_size;
  std::vector<std::vector<float>> out;
  for (const auto& p : prompts) out.emplace_back(p.size() * V, 0.f);
  for (size_t g = 0; g < prompts.size(); g += static_cast<size_t>(engine.max_batch())) {
    const size_t end = std::min(prompts.size(), g + static_cast<size_t>(engine.max_batch()));
    std::vector<SeqId> seqs;
    std::vector<size_t> fed(prompts.size(), 0);
    for (size_t i = g; i < end; ++i) {
      const auto id = engine.open(static_cast<int64_t>(prompts[i].size()));
      if (!id) throw std::runtime_error("teacher_forced: no KV room");
      seqs.push_back(*id);
      fed[i] = std::max<size_t>(1, prompts[i].size() / 2);
      const std::span<const int32_t> chunk[1] = {std::span(prompts[i]).first(fed[i])};
      engine.step(std::span(&seqs.back(), 1), chunk, std::span(out[i]).subspan((fed[i] - 1) * V, V));
    }
    for (;;) {
      std::vector<SeqId> step_seqs;
      std::vector<std::span<const int32_t>> chunks;
      std::vector<size_t> who;
      for (size_t i = g; i < end; ++i)
        if (fed[i] < prompts[i].size()) {
          step_seqs.push_back(seqs[i - g]);
          chunks.push_back(std::span(prompts[i]).subspan(fed[i], 1));
          who.push_back(i);
        }
      if (who.empty()) break;
      std::vector<float> logits(who.size() * V);
      engine.step(step_seqs, chunks, logits);
      for (size_t j = 0; j < who.size(); ++j) {
        std::copy_n(logits.data() + j * V, V, out[who[j]].data() + fed[who[j]] * V);
        ++fed[who[j]];
      }
    }
    for (SeqId s : seqs) engine.close(s);
  }
  return out;
}

// teacher_forced on a new engine with `opt` that launches eagerly, to compare with `replayed`, the
// logits of its CUDA-graph replays. Under racecheck (under_racecheck) `replayed` itself: the eager
// launches run the same kernels, and a decode step there takes seconds.
std::vector<std::vector<float>> teacher_forced_eagerly(const WeightSource& source, EngineOptions opt,
                                                       const std::vector<std::vector<int32_t>>& prompts,
                                                       const std::vector<std::vector<float>>& replayed) {
  if (under_racecheck()) return replayed;
  opt.cuda_graphs = false;
  CudaEngine eager(source, opt);
  return teacher_forced(eager, prompts);
}

// The fixture prompts, to teacher-force on engines of each decode batch size. Under racecheck
// (under_racecheck) the first four: the fifth's 71 decode steps (141 tokens), most of such a
// test's launches, run the kernels the shorter prompts' do, and its long-context attention runs
// under racecheck in BatchedGreedyEqualsEachAlone.
std::vector<std::vector<int32_t>> fixture_prompts_to_teacher_force(const std::vector<testing::FixtureCase>& cases) {
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : cases) prompts.push_back(c.ids);
  return first(prompts, under_racecheck() ? 4 : prompts.size());
}

EngineOptions decode_batch(int64_t max_batch, std::optional<bool> skinny) {
  EngineOptions opt;
  opt.max_batch = max_batch;
  opt.skinny_gemm = skinny;
  return modest(opt);
}

// skinny_gemm (norms and SwiGLU fused in) against cuBLASLt's decode path: the same greedy
// tokens (but at float32 near ties), decode logits within bf16 rounding of each other and of
// transformers' float32, and the CUDA-graph replay bit-identical to the eager launches.
TEST(CudaEngine, SkinnyGemmDecodeMatchesTheCublasPath) {
  GPULAB_REQUIRE_GPU();
  const auto source = tiny();
  const auto which = [&](int64_t max_batch, std::optional<bool> skinny) {
    return decode_skinny_gemm(decode_batch(max_batch, skinny), source.config());
  };
  if (which(16, true) != DecodeSkinny::all) GTEST_SKIP() << "skinny_gemm is switched off (GPULAB_SKINNY_GEMM=0)";
  EXPECT_EQ(which(17, true), DecodeSkinny::none);
  EXPECT_EQ(which(16, false), DecodeSkinny::none);
  if (!core::env_switch("GPULAB_SKINNY_GEMM")) {  // unset: all where the GEMV takes the pass, else plain
    EXPECT_EQ(which(kernels::kGemvMaxRows, std::nullopt), DecodeSkinny::all);
    EXPECT_EQ(which(kernels::kGemvMaxRows + 1, std::nullopt), DecodeSkinny::plain);
    EXPECT_EQ(which(16, std::nullopt), DecodeSkinny::plain);
    EXPECT_EQ(which(17, std::nullopt), DecodeSkinny::none);
  }
  const auto cases = testing::load_fixture_cases("llama_tiny");
  const auto prompts = fixture_prompts_to_teacher_force(cases);
  constexpr int64_t V = 1024;
  const CpuModel cpu(source);
  // Under racecheck the scheduler's greedy runs are left out (under_racecheck): they launch the
  // teacher-forced passes' kernels again, for a few hundred more steps.
  for (int64_t batch : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{16}}) {  // GEMV: 1, 2 rows
    CudaEngine skinny(source, decode_batch(batch, true)), cublas(source, decode_batch(batch, false));
    const auto got = teacher_forced(skinny, prompts), want = teacher_forced(cublas, prompts);
    const auto got_eager = teacher_forced_eagerly(source, decode_batch(batch, true), prompts, got);
    // Above the GEMV's rows, the default runs every layer on skinny_gemm's plain-input kernel.
    std::optional<CudaEngine> mixed;
    if (batch > kernels::kGemvMaxRows) mixed.emplace(source, decode_batch(batch, std::nullopt));
    const auto got_mixed = mixed ? teacher_forced(*mixed, prompts) : got;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const size_t first = std::max<size_t>(1, prompts[i].size() / 2) - 1;
      const auto from_first = [&](const std::vector<float>& all) {
        return std::vector<float>(all.begin() + first * V, all.end());
      };
      const std::vector<float> mine = from_first(got[i]), theirs = from_first(want[i]);
      const Agreement a = compare_logits(mine, theirs, V), f = compare_logits(mine, from_first(cases[i].logits), V);
      const Agreement o = compare_logits(from_first(got_mixed[i]), theirs, V);
      std::printf("batch %lld case %zu: skinny vs cuBLASLt rel L2 %.2e top-1 %lld/%lld; vs float32 rel L2 %.2e; "
                  "plain inputs on skinny vs cuBLASLt %.2e\n",
                  (long long)batch, i, a.rel_l2, (long long)a.top1_agree, (long long)a.rows, f.rel_l2, o.rel_l2);
      EXPECT_LE(a.rel_l2, 5e-3) << "batch " << batch << " case " << i;
      EXPECT_LE(f.rel_l2, 2e-2) << "batch " << batch << " case " << i;
      EXPECT_LE(o.rel_l2, 5e-3) << "batch " << batch << " case " << i;
      EXPECT_EQ(got_eager[i], got[i]) << "batch " << batch << " case " << i << ": graph replay differs from eager";
    }
    if (under_racecheck()) continue;
    // Greedy through the scheduler: the same tokens, or where they part, a float32 near tie
    // between the two (a rounding difference may tip one, not a wrong result).
    const auto prompts16 = sixteen_prompts();
    const auto on = greedy(skinny, prompts16, 24), off = greedy(cublas, prompts16, 24);
    int parted = 0;
    for (size_t i = 0; i < on.size(); ++i) {
      const auto split = std::mismatch(on[i].begin(), on[i].end(), off[i].begin(), off[i].end());
      if (split.first == on[i].end()) continue;
      ++parted;
      std::vector<int32_t> ids = prompts16[i];
      ids.insert(ids.end(), on[i].begin(), split.first);
      const std::vector<float> fp32 = cpu.logits(ids);
      const float* row = fp32.data() + (ids.size() - 1) * V;
      const size_t t = split.first - on[i].begin();
      std::printf("batch %lld request %zu parts at token %zu: skinny %d, cuBLASLt %d (float32 margins %.4f, %.4f)\n",
                  (long long)batch, i, t, *split.first, *split.second, fp32_gap(row, V, *split.first),
                  fp32_gap(row, V, *split.second));
      EXPECT_TRUE(near_tie(row, V, *split.first) && near_tie(row, V, *split.second))
          << "batch " << batch << " request " << i << " token " << t << ": not a near tie";
    }
    EXPECT_LE(parted, 2) << "batch " << batch;
  }
}

// fp8 weights where the GEMV takes the decode passes (max batch ≤ 2): the linear layers run there
// weight-only, their bf16 input not quantized, while prefill stays on cuBLASLt's fp8 GEMMs with
// quantized activations (W8A8). The decode rows must land nearer the bf16 engine than W8A8's do,
// flip its top token only at fp8 near ties, and replay from the graph as launched eagerly.
// Above the GEMV's rows (max batch 3..16) the fp8 layers run W8A8 on skinny_gemm's tensor cores:
// cuBLASLt's arithmetic in another order (their sums agree exactly on integer inputs,
// test_skinny_gemm_gpu.cpp). Each layer's input is quantized again, so a rounding difference
// upstream moves elements across e4m3 steps: the decode rows of the two parted by 3.7-5.1 %
// relative L2 per fixture case on the H200 (session 15), against 8.4 % between cuBLASLt's and the
// bf16 engine's. A wrong scale or fragment is off by order 1.
// The rows of teacher_forced's logits that decode passes gave: from each prompt's first decode row.
std::vector<float> decode_rows(const std::vector<float>& logits, size_t prompt_tokens, int64_t vocab) {
  const size_t first = std::max<size_t>(1, prompt_tokens / 2);
  return std::vector<float>(logits.begin() + static_cast<int64_t>(first) * vocab, logits.end());
}

TEST(CudaEngine, Fp8DecodeOnSkinnyGemm) {
  GPULAB_REQUIRE_GPU();
  const auto source = tiny();
  const auto fp8 = [](int64_t max_batch, std::optional<bool> skinny) {
    EngineOptions opt = decode_batch(max_batch, skinny);
    opt.weights = WeightFormat::fp8;
    return opt;
  };
  const auto which = [&](const EngineOptions& opt) { return decode_skinny_gemm(opt, source.config()); };
  if (which(fp8(1, std::nullopt)) != DecodeSkinny::all)
    GTEST_SKIP() << "skinny_gemm is switched off (GPULAB_SKINNY_GEMM=0)";
  EXPECT_EQ(which(fp8(kernels::kGemvMaxRows, std::nullopt)), DecodeSkinny::all);
  EXPECT_EQ(which(fp8(kernels::kGemvMaxRows + 1, std::nullopt)), DecodeSkinny::w8a8);
  EXPECT_EQ(which(fp8(kernels::kSkinnyMaxRows, true)), DecodeSkinny::w8a8);
  EXPECT_EQ(which(fp8(kernels::kSkinnyMaxRows + 1, std::nullopt)), DecodeSkinny::none);
  EXPECT_EQ(which(fp8(kernels::kSkinnyMaxRows, false)), DecodeSkinny::none);
  const auto prompts = fixture_prompts_to_teacher_force(testing::load_fixture_cases("llama_tiny"));
  constexpr int64_t V = 1024;
  for (int64_t batch = 1; batch <= kernels::kGemvMaxRows; ++batch) {
    CudaEngine gemv(source, fp8(batch, std::nullopt));
    CudaEngine w8a8(source, fp8(batch, false)), bf16(source, decode_batch(batch, std::nullopt));
    const auto got = teacher_forced(gemv, prompts);
    const auto got_eager = teacher_forced_eagerly(source, fp8(batch, std::nullopt), prompts, got);
    const auto cublas = teacher_forced(w8a8, prompts), want = teacher_forced(bf16, prompts);
    llm::testing::Fp8Agreement weight_only, both;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto rows = [&](const std::vector<float>& all) { return decode_rows(all, prompts[i].size(), V); };
      weight_only.add(rows(got[i]), rows(want[i]), V);
      both.add(rows(cublas[i]), rows(want[i]), V);
      EXPECT_EQ(got_eager[i], got[i]) << "batch " << batch << " case " << i << ": graph replay differs from eager";
    }
    const std::string what = "batch " + std::to_string(batch);
    weight_only.print((what + ": fp8 weight-only GEMV decode vs the bf16 engine").c_str());
    both.print((what + ": fp8 W8A8 cuBLASLt decode vs the bf16 engine").c_str());
    EXPECT_TRUE(weight_only.finite) << what;
    EXPECT_LT(weight_only.rel_l2(), both.rel_l2()) << what;
    EXPECT_GE(double(weight_only.decided_agree) / weight_only.decided, 0.95) << what;
    EXPECT_LE(weight_only.worst_flip, 0.125f) << what << ": a flip outside an fp8 near tie";
  }
  for (int64_t batch : {kernels::kGemvMaxRows + 1, kernels::kSkinnyMaxRows}) {
    CudaEngine w8a8(source, fp8(batch, std::nullopt)), cublas(source, fp8(batch, false));
    const auto got = teacher_forced(w8a8, prompts);
    const auto got_eager = teacher_forced_eagerly(source, fp8(batch, std::nullopt), prompts, got);
    const auto want = teacher_forced(cublas, prompts);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto rows = [&](const std::vector<float>& all) { return decode_rows(all, prompts[i].size(), V); };
      const Agreement a = compare_logits(rows(got[i]), rows(want[i]), V);
      std::printf("batch %lld case %zu: fp8 W8A8 on skinny_gemm vs cuBLASLt: rel L2 %.2e, top-1 %lld/%lld\n",
                  (long long)batch, i, a.rel_l2, (long long)a.top1_agree, (long long)a.rows);
      EXPECT_LE(a.rel_l2, 8e-2) << "batch " << batch << " case " << i;
      EXPECT_EQ(got_eager[i], got[i]) << "batch " << batch << " case " << i << ": graph replay differs from eager";
    }
  }
}

// The fused path with biases on q/k/v and o, against the CPU reference.
TEST(CudaEngine, SkinnyGemmDecodeWithBiasesMatchesTheCpuModel) {
  GPULAB_REQUIRE_GPU();
  LlamaConfig cfg = read_model_config(testing::fixture_dir("llama_tiny"));
  cfg.qkv_bias = true;
  cfg.o_bias = true;
  const auto source = WeightSource::random(cfg, 4);
  if (decode_skinny_gemm(decode_batch(4, true), cfg) != DecodeSkinny::all) GTEST_SKIP() << "skinny_gemm is switched off";
  CudaEngine engine(source, decode_batch(4, true));
  const CpuModel cpu(source);
  const std::vector<std::vector<int32_t>> prompts = {{1, 50, 900, 3, 3, 3, 77, 12, 5}, {7, 7, 8}};
  const auto got = teacher_forced(engine, prompts);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const size_t first = prompts[i].size() / 2 - 1;
    const std::vector<float> want = cpu.logits(prompts[i]);
    const std::vector<float> mine(got[i].begin() + first * cfg.vocab_size, got[i].end());
    const std::vector<float> ref(want.begin() + first * cfg.vocab_size, want.end());
    EXPECT_LE(compare_logits(mine, ref, cfg.vocab_size).rel_l2, 2e-2) << "prompt " << i;
  }
}

}  // namespace
}  // namespace gpulab::llm
