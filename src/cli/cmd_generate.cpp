// gpulab generate: text from a prompt, streamed to stdout; timing to stderr.
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "llm/scheduler.h"

namespace gpulab::cli {

namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompt;
  int64_t max_new_tokens = 64;
  llm::SamplingParams sampling;
  std::vector<std::string> stop;
  bool add_special = true;
  bool ignore_eos = false;
};

int run_generate(const GenerateOptions& opt) {
  const llm::Tokenizer tokenizer = load_tokenizer(opt.model);
  const llm::WeightSource weights = load_weights(opt.model);
  auto engine = llm::make_engine(weights, opt.model.engine);
  llm::Scheduler scheduler(*engine, tokenizer);

  llm::GenerationRequest request;
  request.prompt = tokenizer.encode(opt.prompt, opt.add_special);
  request.max_new_tokens = opt.max_new_tokens;
  request.sampling = opt.sampling;
  request.stop = opt.stop;
  request.stop_at_eos = !opt.ignore_eos;
  request.on_text = [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  llm::GenerationResult result;
  request.on_done = [&result](const llm::GenerationResult& r) { result = r; };
  scheduler.submit(std::move(request));
  scheduler.run_until_idle();

  std::printf("\n");
  const double decode_ms = result.total_ms - result.ttft_ms;
  const double decode_tps = result.tokens.size() > 1 ? (result.tokens.size() - 1) / (decode_ms / 1000.0) : 0.0;
  std::fprintf(stderr, "[%s] prompt %lld tokens, generated %zu tokens (%s); TTFT %.1f ms, decode %.1f tokens/s\n",
               engine->device_name(), static_cast<long long>(result.prompt_tokens), result.tokens.size(),
               result.finish_reason.c_str(), result.ttft_ms, decode_tps);
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<GenerateOptions>();
  auto* sub = app.add_subcommand("generate", "Generate text from a prompt with a LLaMA-family checkpoint");
  add_model_options(*sub, opt->model);
  sub->add_option("--prompt", opt->prompt, "The prompt text")->required();
  sub->add_option("--max-new-tokens", opt->max_new_tokens, "Most tokens to generate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--temperature", opt->sampling.temperature, "0 for greedy; higher is more random")
      ->capture_default_str();
  sub->add_option("--top-p", opt->sampling.top_p, "Nucleus sampling: keep the most likely tokens up to this probability")
      ->capture_default_str();
  sub->add_option("--top-k", opt->sampling.top_k, "Keep only the k most likely tokens (0: all)")->capture_default_str();
  sub->add_option("--seed", opt->sampling.seed, "Random seed for sampling")->capture_default_str();
  sub->add_option("--stop", opt->stop, "Stop when this text appears (repeatable)");
  sub->add_flag("!--no-special", opt->add_special, "Do not add the tokenizer's special tokens (e.g. BOS) to the prompt");
  sub->add_flag("--ignore-eos", opt->ignore_eos, "Keep generating past end-of-sequence tokens");
  sub->footer("Example:\n  gpulab generate --model ~/models/Llama-2-7b-hf --prompt \"The H200 is\" --max-new-tokens 64 --device cuda\n"
              "Text streams to stdout; prompt size, TTFT and decode speed go to stderr.");
  sub->callback([&run, opt] { run = [opt] { return run_generate(*opt); }; });
}

}  // namespace gpulab::cli
