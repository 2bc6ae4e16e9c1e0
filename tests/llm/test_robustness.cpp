// Regression tests for config.json and tokenizer.json inputs the fuzzers (tests/fuzz) found or aim at.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fixtures.h"
#include "llm/config.h"
#include "llm/engine.h"
#include "llm/scheduler.h"
#include "llm/tokenizer.h"

using namespace gpulab;
using nlohmann::json;

namespace {

json tiny_config() {
  std::ifstream in(llm::testing::fixture_dir("llama_tiny") / "config.json");
  return json::parse(in);
}

std::string refusal(const std::string& text) {
  try {
    llm::parse_config(text, "config.json");
  } catch (const core::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// crash_number_beyond_double in the corpus: 1e99999 escaped json::parse as out_of_range.
TEST(ConfigRobustness, NumberBeyondDoubleIsMalformedJson) {
  EXPECT_NE(refusal(R"({"architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e99999})").find("malformed JSON"),
            std::string::npos);
}

TEST(ConfigRobustness, ImplausibleSizesAreRefusedBeforeTheyOverflow) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size", "head_dim",
                            "num_attention_heads", "max_position_embeddings"}) {
    json c = tiny_config();
    c[field] = int64_t{1} << 40;
    if (std::string(field) == "num_attention_heads") c["num_key_value_heads"] = int64_t{1} << 40;
    EXPECT_NE(refusal(c.dump()).find("implausibly large"), std::string::npos) << field << ": " << refusal(c.dump());
  }
  json c = tiny_config();
  c["hidden_size"] = int64_t{1} << 20;
  c["intermediate_size"] = int64_t{1} << 22;
  c["num_hidden_layers"] = int64_t{1} << 12;
  c["vocab_size"] = int64_t{1} << 24;
  const llm::LlamaConfig big = llm::parse_config(c.dump(), "config.json");  // the largest accepted
  EXPECT_GT(big.num_params(), int64_t{1} << 50);
}

TEST(ConfigRobustness, NonPositiveSlidingWindowIsRefused) {
  json c = tiny_config();
  c["architectures"] = {"MistralForCausalLM"};
  c["model_type"] = "mistral";
  c["sliding_window"] = 0;
  EXPECT_NE(refusal(c.dump()).find("sliding_window"), std::string::npos) << refusal(c.dump());
  c["sliding_window"] = 64;
  EXPECT_EQ(llm::parse_config(c.dump(), "config.json").max_position_embeddings, 64);
}

namespace {

// A minimal BPE tokenizer.json (ids 0..3) with the given post_processor and decoder.
std::string load_refusal(const json& post_processor, const json& decoder = nullptr) {
  const json doc = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
                    {"added_tokens", {{{"id", 3}, {"content", "<s>"}, {"special", true}}}},
                    {"post_processor", post_processor},
                    {"decoder", decoder}};
  const auto path = std::filesystem::temp_directory_path() / ("gpulab_tok_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << doc.dump();
  std::string refusal;
  try {
    llm::Tokenizer::from_file(path);
  } catch (const core::InputError& e) {
    refusal = e.what();
  }
  std::filesystem::remove(path);
  return refusal;
}

json template_with_ids(const json& ids) {
  return {{"type", "TemplateProcessing"},
          {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", ids}, {"tokens", {"<s>"}}}}}}};
}

}  // namespace

// Post-processor ids were taken unchecked (floats cast, ids beyond the vocabulary reached the
// engine's embedding lookup); decoder counts were cast from any number.
TEST(TokenizerRobustness, PostProcessorIdsAndDecoderCountsAreChecked) {
  EXPECT_EQ(load_refusal(template_with_ids({3})), "");
  EXPECT_NE(load_refusal(template_with_ids({1e300})).find("bad id"), std::string::npos);
  EXPECT_NE(load_refusal(template_with_ids({-1})).find("bad id"), std::string::npos);
  EXPECT_NE(load_refusal(template_with_ids({4})).find("beyond the vocabulary"), std::string::npos);
  EXPECT_NE(load_refusal(template_with_ids(3)).find("not a list"), std::string::npos);
  const json roberta = {{"type", "RobertaProcessing"}, {"cls", {"<s>", 3}}, {"sep", {"</s>", 2.5}}};
  EXPECT_NE(load_refusal(roberta).find("bad id"), std::string::npos);
  const json strip = {{"type", "Strip"}, {"content", " "}, {"start", 1e300}, {"stop", 0}};
  EXPECT_NE(load_refusal(nullptr, strip).find("Strip start"), std::string::npos);
}

// crash_byte_run_turns_invalid in the fuzz corpus: with SentencePiece byte fallback, the byte run
// E1 BA 9B CC A3 (valid: "ẛ̣") followed by E3 (invalid) decodes as a whole to U+FFFD per byte, so
// streaming had sent "ẛ̣" and then a cut-off suffix (a stray 0xBD byte: invalid UTF-8 to clients).
TEST(TokenizerRobustness, StreamedTextEqualsDecodeWhenAByteRunTurnsInvalid) {
  const std::string text =
      "e\xcc\x81 \xe2\x84\xab \xe1\xba\x9b\xcc\xa3\xe3\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
      "\xf0\x9f\x99\x82";
  const llm::Tokenizer tok = llm::Tokenizer::from_file(llm::testing::fixture_dir("tokenizer_spm"));
  const std::vector<int32_t> ids = tok.encode(text);
  const std::string decoded = tok.decode(ids);
  ASSERT_NE(decoded.find("\xEF\xBF\xBD"), std::string::npos) << "the run decodes to U+FFFD";
  llm::Tokenizer::StreamState state;
  std::string streamed;
  for (size_t n = 1; n <= ids.size(); ++n) streamed += tok.decode_stream(std::span(ids).first(n), state, false, n == ids.size());
  EXPECT_EQ(streamed, decoded);
  // Text without byte tokens still streams token by token.
  const std::vector<int32_t> plain = tok.encode("hello world, this is plain text");
  state = {};
  size_t pieces = 0;
  for (size_t n = 1; n <= plain.size(); ++n) pieces += !tok.decode_stream(std::span(plain).first(n), state).empty();
  EXPECT_GE(pieces + 1, plain.size());
}

// crash_head_dim_zero in the fuzz corpus: hidden_size 2 with 8 heads and no head_dim parsed as
// head_dim 0 (hidden_size / num_heads), a shape no engine can run.
TEST(ConfigRobustness, HeadDimFromHiddenSizeMustDivideEvenly) {
  json c = tiny_config();
  c.erase("head_dim");
  c["hidden_size"] = 2;
  EXPECT_NE(refusal(c.dump()).find("not a multiple of num_attention_heads"), std::string::npos) << refusal(c.dump());
  c["hidden_size"] = 102;  // 4 heads
  EXPECT_NE(refusal(c.dump()).find("not a multiple of num_attention_heads"), std::string::npos);
  c["hidden_size"] = 256;
  EXPECT_EQ(llm::parse_config(c.dump(), "config.json").head_dim, 64);
}

namespace {

// An engine whose greedy choice at each step is the next token of a script.
class ScriptedEngine final : public llm::Engine {
 public:
  ScriptedEngine(llm::LlamaConfig cfg, std::vector<int32_t> script) : cfg_(std::move(cfg)), script_(std::move(script)) {}
  const llm::LlamaConfig& config() const override { return cfg_; }
  const char* device_name() const override { return "scripted"; }
  int64_t max_batch() const override { return 1; }
  int64_t kv_capacity_tokens() const override { return 4096; }
  int64_t kv_free_tokens() const override { return open_ ? 0 : 4096; }
  int64_t max_sequence_tokens() const override { return 4096; }
  std::optional<llm::SeqId> open(int64_t) override {
    open_ = true;
    return 0;
  }
  void close(llm::SeqId) override { open_ = false; }
  void step(std::span<const llm::SeqId>, std::span<const std::span<const int32_t>>, std::span<float> logits) override {
    std::fill(logits.begin(), logits.end(), 0.f);
    logits[script_[std::min(next_++, script_.size() - 1)]] = 1.f;
  }

 private:
  llm::LlamaConfig cfg_;
  std::vector<int32_t> script_;
  size_t next_ = 0;
  bool open_ = false;
};

}  // namespace

// The same byte run through the scheduler, which streams `serve`'s text: the pieces it hands to
// on_text must concatenate to the final text, and each must be valid UTF-8 on its own.
TEST(TokenizerRobustness, SchedulerStreamsAByteRunThatTurnsInvalidConsistently) {
  // The fixture marks its byte tokens special (the scheduler's text skips those); in Llama 2's
  // own tokenizer.json they are plain vocabulary, as here.
  json doc;
  std::ifstream(llm::testing::fixture_dir("tokenizer_spm") / "tokenizer.json") >> doc;
  for (json& added : doc["added_tokens"])
    if (added["content"].get<std::string>().starts_with("<0x")) added["special"] = false;
  const auto path = std::filesystem::temp_directory_path() / ("gpulab_spm_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << doc.dump();
  const llm::Tokenizer tok = llm::Tokenizer::from_file(path);
  std::filesystem::remove(path);
  const std::vector<int32_t> script = tok.encode("ok \xe1\xba\x9b\xcc\xa3\xe3\xed\x95\x9c done");
  ASSERT_NE(tok.decode(script, true).find("\xEF\xBF\xBD"), std::string::npos) << "the run decodes to U+FFFD";
  llm::LlamaConfig cfg = llm::read_model_config(llm::testing::fixture_dir("llama_tiny"));
  cfg.vocab_size = tok.vocab_size();
  cfg.max_position_embeddings = 4096;
  ScriptedEngine engine(cfg, script);
  llm::Scheduler scheduler(engine, tok);
  llm::GenerationRequest r;
  r.prompt = {script[0]};
  r.max_new_tokens = static_cast<int64_t>(script.size());
  r.stop_at_eos = false;
  std::vector<std::string> pieces;
  llm::GenerationResult result;
  r.on_text = [&](const std::string& piece) {
    pieces.push_back(piece);
    return true;
  };
  r.on_done = [&](const llm::GenerationResult& res) { result = res; };
  scheduler.submit(std::move(r));
  scheduler.run_until_idle();
  ASSERT_EQ(result.tokens, script);
  std::string streamed;
  for (const auto& p : pieces) {
    EXPECT_EQ(json(p).dump(-1, ' ', false, json::error_handler_t::strict).empty(), false);  // throws if not UTF-8
    streamed += p;
  }
  EXPECT_EQ(streamed, result.text);
  EXPECT_EQ(result.text, tok.decode(script, true));
}
