// The CUDA engine against the transformers fixtures and against itself: logits within the bf16
// tolerance of the float32 reference, greedy decoding independent of batching, and requests
// that cannot fit refused with a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/gpu.h"
#include "core/error.h"
#include "llm/cpu_model.h"
#include "llm/cuda_engine.h"
#include "llm/fixtures.h"

namespace gpulab::llm {
namespace {

struct Agreement {
  double rel_l2;
  double top1;
};

Agreement compare_logits(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  double num = 0, den = 0;
  int64_t agree = 0;
  const int64_t rows = static_cast<int64_t>(want.size()) / vocab;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return {INFINITY, 0};
    num += (got[i] - want[i]) * double(got[i] - want[i]);
    den += want[i] * double(want[i]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got.data() + r * vocab;
    const float* w = want.data() + r * vocab;
    agree += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
  }
  return {std::sqrt(num / den), double(agree) / rows};
}

// Engines in these tests keep a modest KV pool, so several can live at once.
EngineOptions modest(EngineOptions opt = {}) {
  if (opt.max_kv_tokens == 0) opt.max_kv_tokens = 1 << 16;
  return opt;
}

class CudaEngineFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEngineFixture, LogitsMatchTransformersFp32) {
  GPULAB_REQUIRE_GPU();
  CudaEngine engine(WeightSource::from_checkpoint(testing::fixture_dir(GetParam())), modest());
  const auto cases = testing::load_fixture_cases(GetParam());
  int64_t rows = 0, agree_rows = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<float> got = engine.logits(cases[i].ids);
    ASSERT_EQ(got.size(), cases[i].logits.size()) << "case " << i;
    const Agreement a = compare_logits(got, cases[i].logits, 1024);
    EXPECT_LE(a.rel_l2, 2e-2) << "case " << i;
    rows += cases[i].ids.size();
    agree_rows += std::llround(a.top1 * cases[i].ids.size());
    std::printf("case %zu: rel L2 %.2e, top-1 %.1f%%\n", i, a.rel_l2, 100 * a.top1);
  }
  EXPECT_GE(double(agree_rows) / rows, 0.98) << agree_rows << " of " << rows << " positions agree on top-1";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaEngineFixture, ::testing::Values("llama_tiny", "llama_tiny_sharded"));

// 16 different prompts: the fixture prompts and random ones of varied lengths.
std::vector<GenerationRequest> sixteen_requests(int64_t max_new) {
  std::vector<GenerationRequest> reqs;
  for (const auto& c : testing::load_fixture_cases("llama_tiny")) reqs.push_back({c.ids, max_new});
  std::mt19937 rng(5);
  while (reqs.size() < 16) {
    std::vector<int32_t> ids(std::uniform_int_distribution<int>(1, 90)(rng));
    for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, 1023)(rng);
    reqs.push_back({ids, max_new});
  }
  return reqs;
}

std::vector<std::vector<int32_t>> one_at_a_time(CudaEngine& engine, const std::vector<GenerationRequest>& reqs) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : reqs) out.push_back(engine.generate_greedy({r})[0]);
  return out;
}

TEST(CudaEngine, BatchedGreedyEqualsEachAlone) {
  GPULAB_REQUIRE_GPU();
  CudaEngine engine(WeightSource::from_checkpoint(testing::fixture_dir("llama_tiny")), modest());
  const auto reqs = sixteen_requests(24);
  const auto batched = engine.generate_greedy(reqs);
  const auto alone = one_at_a_time(engine, reqs);
  ASSERT_EQ(batched.size(), 16u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(batched[i].size(), 24u);
    EXPECT_EQ(batched[i], alone[i]) << "request " << i;
  }
  // Beside the float32 fixture: report how far bf16 greedy follows it.
  const auto cases = testing::load_fixture_cases("llama_tiny");
  for (size_t i = 0; i < cases.size(); ++i) {
    size_t same = 0;
    while (same < 24 && batched[i][same] == cases[i].greedy[same]) ++same;
    std::printf("case %zu: first %zu of 24 greedy tokens equal the float32 fixture\n", i, same);
    EXPECT_EQ(batched[i][0], cases[i].greedy[0]) << "case " << i;
  }
}

TEST(CudaEngine, ContinuousBatchingInASmallPoolAndWithoutGraphs) {
  GPULAB_REQUIRE_GPU();
  const auto source = WeightSource::from_checkpoint(testing::fixture_dir("llama_tiny"));
  const auto reqs = sixteen_requests(20);
  CudaEngine reference(source, modest());
  const auto alone = one_at_a_time(reference, reqs);
  // A pool of 320 tokens and 3 batch slots: requests wait for pages and slots, and start
  // while others are decoding.
  EngineOptions small;
  small.max_kv_tokens = 320;
  small.max_batch = 3;
  small.max_seq_len = 256;
  CudaEngine constrained(source, small);
  EXPECT_EQ(constrained.capacity().kv_blocks, 20);
  EXPECT_EQ(constrained.generate_greedy(reqs), alone);
  EngineOptions eager;
  eager.cuda_graphs = false;
  CudaEngine no_graphs(source, modest(eager));
  EXPECT_EQ(no_graphs.generate_greedy(reqs), alone);
}

TEST(CudaEngine, RequestsThatCannotFitAreRefused) {
  GPULAB_REQUIRE_GPU();
  const auto source = WeightSource::from_checkpoint(testing::fixture_dir("llama_tiny"));
  EngineOptions opt;
  opt.max_kv_tokens = 64;
  opt.max_seq_len = 128;
  CudaEngine engine(source, opt);
  std::vector<int32_t> prompt(60, 7);
  try {
    engine.generate_greedy({{prompt, 10}});
    ADD_FAILURE() << "a request larger than the KV pool ran";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("needs 70 tokens of KV cache but the pool holds 64"), std::string::npos) << e.what();
  }
  try {
    engine.generate_greedy({{std::vector<int32_t>(100, 7), 40}});
    ADD_FAILURE() << "a request longer than max_seq_len ran";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("exceed the engine's max sequence length 128"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine.logits(std::vector<int32_t>{1, 1024}), core::InputError);
  // Still usable, with all pages back in the pool.
  EXPECT_EQ(engine.generate_greedy({{prompt, 4}})[0].size(), 4u);
  EXPECT_EQ(engine.generate_greedy({{std::vector<int32_t>(50, 3), 14}})[0].size(), 14u);

  EngineOptions tiny_fraction;
  tiny_fraction.gpu_memory_fraction = 1e-4;
  EXPECT_THROW(CudaEngine(source, tiny_fraction), core::InputError);
}

TEST(CudaEngine, StopsAtAnyEosOfTheList) {
  GPULAB_REQUIRE_GPU();
  const auto cases = testing::load_fixture_cases("llama_tiny");
  std::vector<int32_t> full;
  {
    CudaEngine engine(WeightSource::from_checkpoint(testing::fixture_dir("llama_tiny")), modest());
    full = engine.generate_greedy({{cases[0].ids, 24}})[0];
  }
  // The same model with the 6th generated token declared an eos (second of a list).
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("gpulab_eos_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(testing::fixture_dir("llama_tiny") / f, dir / f, fs::copy_options::overwrite_existing);
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": [1023, " << full[5] << "]}";
  CudaEngine engine(WeightSource::from_checkpoint(dir), modest());
  fs::remove_all(dir);
  const auto stopped = engine.generate_greedy({{cases[0].ids, 24, true}})[0];
  const size_t first = std::find(full.begin(), full.end(), full[5]) - full.begin();
  EXPECT_EQ(stopped, std::vector<int32_t>(full.begin(), full.begin() + first + 1));
  EXPECT_EQ(engine.generate_greedy({{cases[0].ids, 24, false}})[0], full);
}

TEST(CudaEngine, RandomWeightsFilledOnTheDeviceMatchTheHostFill) {
  GPULAB_REQUIRE_GPU();
  LlamaConfig cfg = read_model_config(testing::fixture_dir("llama_tiny"));
  cfg.qkv_bias = true;  // also covers the bias path
  const auto source = WeightSource::random(cfg, 3);
  CudaEngine engine(source, modest());
  const CpuModel cpu(source);
  const std::vector<int32_t> ids = {1, 50, 900, 3, 3, 3, 77};
  const Agreement a = compare_logits(engine.logits(ids), cpu.logits(ids), cfg.vocab_size);
  EXPECT_LE(a.rel_l2, 2e-2);
}

}  // namespace
}  // namespace gpulab::llm
