// Continuous batching on the CPU engine: batched, chunked and interleaved requests must give
// exactly what each request gives alone (the transformers greedy continuation of the fixtures).
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <map>

#include "core/error.h"
#include "fixtures.h"
#include "llm/engine.h"
#include "llm/scheduler.h"

using namespace gpulab;
using namespace gpulab::llm;

namespace {

// Delegates to the CPU engine and records how many sequences were open at once.
class CountingEngine final : public Engine {
 public:
  explicit CountingEngine(std::unique_ptr<Engine> inner) : inner_(std::move(inner)) {}
  const LlamaConfig& config() const override { return inner_->config(); }
  const char* device_name() const override { return "counting"; }
  int64_t max_batch() const override { return inner_->max_batch(); }
  int64_t kv_capacity_tokens() const override { return inner_->kv_capacity_tokens(); }
  int64_t kv_free_tokens() const override { return inner_->kv_free_tokens(); }
  int64_t max_sequence_tokens() const override { return inner_->max_sequence_tokens(); }
  std::optional<SeqId> open(int64_t n) override {
    auto s = inner_->open(n);
    if (s) max_open = std::max(max_open, ++open_now);
    return s;
  }
  void close(SeqId s) override {
    --open_now;
    inner_->close(s);
  }
  void step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks, std::span<float> logits) override {
    max_step = std::max<int64_t>(max_step, seqs.size());
    ++steps;
    int64_t prompt_tokens = 0;  // chunks of one token count as decodes
    for (const auto& c : chunks) {
      prompt_tokens += c.size() > 1 ? static_cast<int64_t>(c.size()) : 0;
      rows += static_cast<int64_t>(c.size());
    }
    max_step_prompt_tokens = std::max(max_step_prompt_tokens, prompt_tokens);
    inner_->step(seqs, chunks, logits);
  }
  int64_t open_now = 0, max_open = 0, max_step = 0, max_step_prompt_tokens = 0, steps = 0, rows = 0;

 private:
  std::unique_ptr<Engine> inner_;
};

struct Harness {
  WeightSource weights = WeightSource::from_checkpoint(llm::testing::fixture_dir("llama_tiny"));
  Tokenizer tokenizer = Tokenizer::from_file(llm::testing::fixture_dir("llama_tiny"));
  CountingEngine engine;
  explicit Harness(int64_t kv_tokens) : engine(make_cpu_engine(weights, kv_tokens, 2)) {}
};

GenerationRequest greedy_request(const std::vector<int32_t>& prompt, int64_t n, std::vector<int32_t>* out) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.stop_at_eos = false;  // the fixture continuation suppresses nothing
  r.on_done = [out](const GenerationResult& res) { *out = res.tokens; };
  return r;
}

}  // namespace

TEST(Scheduler, BatchedChunkedGreedyEqualsTransformers) {
  const auto cases = llm::testing::load_fixture_cases("llama_tiny");
  for (int64_t chunk : {512, 3}) {
    Harness h(4096);
    Scheduler scheduler(h.engine, h.tokenizer, {64, chunk});
    std::vector<std::vector<int32_t>> got(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) scheduler.submit(greedy_request(cases[i].ids, 24, &got[i]));
    scheduler.run_until_idle();
    for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(got[i], cases[i].greedy) << "case " << i << " chunk " << chunk;
    EXPECT_EQ(h.engine.max_step, static_cast<int64_t>(cases.size()));  // all ran in one batch
    EXPECT_EQ(h.engine.kv_free_tokens(), 4096);                           // every sequence released
  }
}

// A step's prompt-token budget delays chunks but never resizes them: every request still gets
// the fixture's continuation, and no step feeds more than the budget.
TEST(Scheduler, StepPrefillBudgetBoundsEachStepAndChangesNoToken) {
  const auto cases = llm::testing::load_fixture_cases("llama_tiny");
  Harness h(4096);
  Scheduler scheduler(h.engine, h.tokenizer, {.prefill_chunk = 3, .step_prefill_tokens = 7});
  std::vector<std::vector<int32_t>> got(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) scheduler.submit(greedy_request(cases[i].ids, 24, &got[i]));
  scheduler.run_until_idle();
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(got[i], cases[i].greedy) << "case " << i;
  EXPECT_LE(h.engine.max_step_prompt_tokens, 7);
  EXPECT_GE(h.engine.max_step_prompt_tokens, 6);  // steps did carry several requests' chunks
  // The step counters /metrics shows: every step and every token fed (the prompt, then each
  // generated token but the last), and the time inside the engine within the steps' time.
  const SchedulerMetrics m = scheduler.metrics();
  int64_t fed = 0;
  for (const auto& c : cases) fed += static_cast<int64_t>(c.ids.size()) + 24 - 1;
  EXPECT_EQ(m.steps, h.engine.steps);
  EXPECT_EQ(m.step_rows, h.engine.rows);
  EXPECT_EQ(m.step_rows, fed);
  EXPECT_GT(m.engine_seconds, 0.0);
  EXPECT_GE(m.step_seconds, m.engine_seconds);
  EXPECT_THROW(Scheduler(h.engine, h.tokenizer, {.step_prefill_tokens = 0}), core::InputError);
}

TEST(Scheduler, RequestsWaitForKvRoomAndAllFinish) {
  const auto cases = llm::testing::load_fixture_cases("llama_tiny");
  const int64_t need = static_cast<int64_t>(cases[0].ids.size()) + 24;
  Harness h(need * 2);  // room for two at a time
  Scheduler scheduler(h.engine, h.tokenizer);
  std::vector<std::vector<int32_t>> got(6);
  for (auto& g : got) scheduler.submit(greedy_request(cases[0].ids, 24, &g));
  scheduler.run_until_idle();
  EXPECT_EQ(h.engine.max_open, 2);
  for (const auto& g : got) EXPECT_EQ(g, cases[0].greedy);
  EXPECT_EQ(h.engine.kv_free_tokens(), need * 2);
}

TEST(Scheduler, RefusesRequestsThatCanNeverRun) {
  Harness h(100);
  Scheduler scheduler(h.engine, h.tokenizer);
  std::vector<int32_t> out;
  EXPECT_THROW(scheduler.submit(greedy_request({}, 4, &out)), core::InputError);                 // empty prompt
  EXPECT_THROW(scheduler.submit(greedy_request({5, 6}, 200, &out)), core::InputError);          // beyond KV room
  EXPECT_THROW(scheduler.submit(greedy_request({5, 6}, 0, &out)), core::InputError);            // nothing to do
  EXPECT_THROW(scheduler.submit(greedy_request({5, 99999}, 4, &out)), core::InputError);        // not a token
  Harness big(100000);
  Scheduler s2(big.engine, big.tokenizer);
  EXPECT_THROW(s2.submit(greedy_request({5, 6}, 600, &out)), core::InputError);                 // beyond context 512
  auto r = greedy_request({5, 6}, 4, &out);
  r.sampling.top_p = 0;
  EXPECT_THROW(s2.submit(std::move(r)), core::InputError);
}

TEST(Scheduler, CancelledRequestsFreeTheirRoom) {
  Harness h(1000);
  Scheduler scheduler(h.engine, h.tokenizer);
  std::string reason;
  auto r = greedy_request({5, 6, 7}, 50, nullptr);
  r.on_done = [&](const GenerationResult& res) { reason = res.finish_reason; };
  int pieces = 0;
  r.on_text = [&](const std::string&) { return ++pieces < 3; };  // the client leaves after 3 tokens
  scheduler.submit(std::move(r));
  scheduler.run_until_idle();
  EXPECT_EQ(reason, "cancelled");
  EXPECT_EQ(pieces, 3);
  EXPECT_EQ(h.engine.kv_free_tokens(), 1000);
  EXPECT_EQ(scheduler.metrics().requests_cancelled, 1);
}

TEST(Scheduler, StopStringCutsTextAndStreamNeverShowsIt) {
  const auto cases = llm::testing::load_fixture_cases("llama_tiny");
  Harness h(4096);
  const std::string full = h.tokenizer.decode(cases[0].greedy, true);
  ASSERT_GT(full.size(), 12u);
  const std::string stop = full.substr(6, 3);
  const std::string expected = full.substr(0, full.find(stop));
  Scheduler scheduler(h.engine, h.tokenizer);
  GenerationResult result;
  std::string streamed;
  auto r = greedy_request(cases[0].ids, 24, nullptr);
  r.stop = {stop};
  r.on_text = [&](const std::string& piece) {
    streamed += piece;
    return true;
  };
  r.on_done = [&](const GenerationResult& res) { result = res; };
  scheduler.submit(std::move(r));
  scheduler.run_until_idle();
  EXPECT_EQ(result.finish_reason, "stop");
  EXPECT_EQ(result.text, expected);
  EXPECT_EQ(streamed, expected);
}

TEST(Scheduler, SeededSamplingIsReproducibleAndTopK1IsGreedy) {
  const auto cases = llm::testing::load_fixture_cases("llama_tiny");
  auto sample = [&](SamplingParams p) {
    Harness h(4096);
    Scheduler scheduler(h.engine, h.tokenizer);
    std::vector<int32_t> out;
    auto r = greedy_request(cases[1].ids, 24, &out);
    r.sampling = p;
    scheduler.submit(std::move(r));
    scheduler.run_until_idle();
    return out;
  };
  const auto a = sample({1.0f, 0, 0.9f, 42}), b = sample({1.0f, 0, 0.9f, 42}), c = sample({1.0f, 0, 0.9f, 43});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(sample({0.7f, 1, 1.0f, 5}), cases[1].greedy);
}

TEST(Scheduler, SampledTokensDoNotDependOnHowManyThreadsSample) {
  // Twelve requests sampled with a temperature, each with its own seed: sampled on one thread or
  // spread over four, every request gets the same tokens (each row keeps its own generator).
  const auto cases = llm::testing::load_fixture_cases("llama_tiny");
  auto run = [&](int threads) {
    Harness h(8192);
    Scheduler scheduler(h.engine, h.tokenizer, {.max_batch = 64, .prefill_chunk = 512, .sampling_threads = threads});
    std::vector<std::vector<int32_t>> got(12);
    for (size_t i = 0; i < got.size(); ++i) {
      auto r = greedy_request(cases[i % cases.size()].ids, 16, &got[i]);
      r.sampling = {1.0f, 0, 1.f, 100 + i};
      scheduler.submit(std::move(r));
    }
    scheduler.run_until_idle();
    return got;
  };
  ASSERT_LT(cases.size(), 12u);  // so some prompts repeat with other seeds
  const auto one = run(1), four = run(4);
  EXPECT_EQ(one, four);
  EXPECT_NE(one[0], one[cases.size()]);  // same prompt, another seed: another draw
}

// Text of sampled (arbitrary) tokens, streamed step by step, with both tokenizer families over
// the tiny model's 1,024 ids: the pieces add up to the decode of the tokens, and so does the
// result's text; a stop string that never matches holds back nothing at the end, and one taken
// from the text cuts it there. At temperature 10 the draws are near uniform, so byte-level text
// has broken UTF-8 (in the SentencePiece fixture the byte tokens are special: text skips them).
TEST(Scheduler, StreamedTextOfSampledTokensIsTheirDecode) {
  const auto cases = llm::testing::load_fixture_cases("llama_tiny");
  constexpr float kTemperature = 10.f;
  for (const auto& [family, broken_utf8] : {std::pair{"tokenizer_bytelevel", true}, std::pair{"tokenizer_spm", false}}) {
    Harness h(16384);
    const Tokenizer tokenizer = Tokenizer::from_file(llm::testing::fixture_dir(family));
    Scheduler scheduler(h.engine, tokenizer);
    constexpr size_t kRequests = 6;
    std::vector<GenerationResult> results(kRequests);
    std::vector<std::string> streamed(kRequests);
    for (size_t i = 0; i < kRequests; ++i) {
      auto r = greedy_request(cases[i % cases.size()].ids, 160, nullptr);
      r.sampling = {kTemperature, 0, 1.f, 7 + i};
      if (i % 2 == 1) r.stop = {"\x01never\x02"};
      r.on_text = [&, i](const std::string& piece) {
        streamed[i] += piece;
        return true;
      };
      r.on_done = [&, i](const GenerationResult& res) { results[i] = res; };
      scheduler.submit(std::move(r));
    }
    scheduler.run_until_idle();
    for (size_t i = 0; i < kRequests; ++i) {
      SCOPED_TRACE(std::string(family) + ", request " + std::to_string(i));
      EXPECT_EQ(results[i].finish_reason, "length");
      EXPECT_EQ(results[i].tokens.size(), 160u);
      const std::string text = tokenizer.decode(results[i].tokens, /*skip_special=*/true);
      EXPECT_EQ(results[i].text, text);
      EXPECT_EQ(streamed[i], text);
    }
    // The draws did reach the hard cases: text a later byte could still change.
    if (broken_utf8) {
      EXPECT_TRUE(std::ranges::any_of(results, [](const GenerationResult& r) { return r.text.find("\xEF\xBF\xBD") != std::string::npos; }))
          << family << ": no U+FFFD in any text";
    }
    // A stop string from the middle of request 0's text: the same draw stops there.
    const std::string text = results[0].text;
    ASSERT_GT(text.size(), 40u);
    const std::string stop = text.substr(text.size() / 2, 4);
    auto r = greedy_request(cases[0].ids, 160, nullptr);
    r.sampling = {kTemperature, 0, 1.f, 7};
    r.stop = {stop};
    std::string stream;
    GenerationResult cut;
    r.on_text = [&](const std::string& piece) {
      stream += piece;
      return true;
    };
    r.on_done = [&](const GenerationResult& res) { cut = res; };
    scheduler.submit(std::move(r));
    scheduler.run_until_idle();
    EXPECT_EQ(cut.finish_reason, "stop");
    EXPECT_EQ(cut.text, text.substr(0, text.find(stop)));
    EXPECT_EQ(stream, cut.text);
  }
}
