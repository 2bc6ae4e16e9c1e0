// gpulab generate: text (or token) continuation of a prompt on the CUDA engine or the CPU
// reference, through the continuous-batching scheduler; --batch N runs N copies together.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "llm/cuda_engine.h"
#include "llm/scheduler.h"
#include "llm/tokenizer.h"
#include "llm/weights.h"

namespace gpulab::cli {

namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompt, ids;
  int64_t max_tokens = 64;
  int64_t batch = 1;
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool json_output = false;
};

int run_generate(const GenerateOptions& opt) {
  if (opt.prompt.empty() == opt.ids.empty()) throw core::InputError("give exactly one of --prompt TEXT and --ids 1,2,3");
  if (opt.batch < 1 || opt.max_tokens < 1) throw core::InputError("--batch and --max-tokens must be at least 1");

  const llm::WeightSource weights = load_weights(opt.model);
  // Random weights may come without a tokenizer: then --ids in, token ids out (no text).
  const std::string tokenizer_path = opt.model.tokenizer.empty() ? opt.model.model : opt.model.tokenizer;
  if (tokenizer_path.empty() && !opt.prompt.empty())
    throw core::InputError("--prompt needs a tokenizer: give --tokenizer FILE, or --ids with --dummy-weights");
  std::optional<llm::Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) tokenizer = llm::Tokenizer::from_file(tokenizer_path);
  const std::vector<int32_t> prompt = opt.prompt.empty() ? parse_token_ids(opt.ids) : tokenizer->encode(opt.prompt, true);

  // As wide as the batch asks (up to 256), with CPU KV room for every copy at full length.
  const int64_t longest = static_cast<int64_t>(prompt.size()) + opt.max_tokens;
  llm::EngineSpec spec = opt.model.engine;
  spec.cuda.max_batch = std::min<int64_t>(opt.batch, 256);
  spec.cpu_kv_tokens = std::max(spec.cpu_kv_tokens, longest * std::min<int64_t>(opt.batch, 64));
  const std::unique_ptr<llm::Engine> engine = llm::make_engine(weights, spec);

  llm::SchedulerOptions so;
  so.max_batch = engine->max_batch();
  llm::Scheduler scheduler = tokenizer ? llm::Scheduler(*engine, *tokenizer, so) : llm::Scheduler(*engine, so);
  std::vector<llm::GenerationResult> results(opt.batch);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < opt.batch; ++i) {
    llm::GenerationRequest r;
    r.prompt = prompt;
    r.max_new_tokens = opt.max_tokens;
    r.sampling = {opt.temperature, opt.top_k, opt.top_p, opt.seed + static_cast<uint64_t>(i)};
    r.stop_at_eos = !opt.ignore_eos;
    if (i == 0 && opt.batch == 1 && !opt.json_output && tokenizer)  // stream the only request's text
      r.on_text = [](const std::string& piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return true;
      };
    r.on_done = [&results, i](const llm::GenerationResult& g) { results[i] = g; };
    scheduler.submit(std::move(r));
  }
  scheduler.run_until_idle();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int64_t generated = 0;
  std::vector<double> ttft;
  for (const auto& g : results) {
    generated += static_cast<int64_t>(g.tokens.size());
    ttft.push_back(g.ttft_ms);
  }
  std::sort(ttft.begin(), ttft.end());
  if (opt.json_output) {
    const char* weights = spec.device == "cpu" ? "fp32" : spec.cuda.weights == llm::WeightFormat::fp8 ? "fp8" : "bf16";
    nlohmann::json out = {{"device", engine->device_name()}, {"weights", weights}, {"tp", spec.tp},
                          {"prompt_tokens", prompt.size()},
                          {"requests", opt.batch}, {"generated_tokens", generated}, {"seconds", seconds},
                          {"tokens_per_second", generated / seconds}, {"ttft_ms_median", ttft[ttft.size() / 2]},
                          {"results", nlohmann::json::array()}};
    for (const auto& g : results)
      out["results"].push_back({{"tokens", g.tokens}, {"text", g.text}, {"finish_reason", g.finish_reason}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (opt.batch > 1) std::cout << results[0].text;
  std::cout << "\n";
  std::fprintf(stderr, "%lld request%s x %zu prompt tokens, %lld tokens generated in %.2f s (%.1f tokens/s, TTFT median %.1f ms) on %s\n",
               static_cast<long long>(opt.batch), opt.batch == 1 ? "" : "s", prompt.size(),
               static_cast<long long>(generated), seconds, generated / seconds, ttft[ttft.size() / 2],
               engine->device_name());
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<GenerateOptions>();
  auto* sub = app.add_subcommand("generate", "LLaMA-family text generation from a Hugging Face checkpoint");
  opt->model.engine.device = "cuda";
  add_model_options(*sub, opt->model);
  sub->add_option("--prompt", opt->prompt, "Prompt text (tokenized with the special tokens, e.g. BOS)");
  sub->add_option("--ids", opt->ids, "Prompt as comma-separated token ids instead of text");
  sub->add_option("--max-tokens", opt->max_tokens, "Tokens to generate per request")->capture_default_str();
  sub->add_option("--batch", opt->batch, "Run this many copies of the request together")->capture_default_str();
  sub->add_option("--temperature", opt->temperature, "0: greedy")->capture_default_str();
  sub->add_option("--top-k", opt->top_k, "0: no limit")->capture_default_str();
  sub->add_option("--top-p", opt->top_p, "1: no nucleus cut")->capture_default_str();
  sub->add_option("--seed", opt->seed, "Sampling seed (request i uses seed + i)")->capture_default_str();
  sub->add_flag("--ignore-eos", opt->ignore_eos, "Always generate --max-tokens tokens");
  sub->add_flag("--json", opt->json_output, "Print results and timings as JSON");
  sub->footer("Examples:\n  gpulab generate --model ~/models/Llama-3.2-1B --prompt 'The GPU is' --max-tokens 32\n"
              "  gpulab generate --dummy-weights --config llama3-8b --tokenizer tok.json --ids 1,2,3 --batch 64 "
              "--max-tokens 256 --ignore-eos --json\n"
              "  gpulab generate --dummy-weights --config llama2-70b --ids 1,2,3 --batch 16 --max-tokens 128 "
              "--ignore-eos --tp 8 --json");
  sub->callback([&run, opt] { run = [opt] { return run_generate(*opt); }; });
}

}  // namespace gpulab::cli
