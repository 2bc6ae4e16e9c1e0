// The JSON body of POST /v1/completions and /v1/chat/completions (the first byte picks which):
// validated into a request the scheduler accepts, or refused with an InputError (HTTP 400).
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "llm/engine.h"
#include "llm/openai_server.h"
#include "llm/scheduler.h"
#include "llm/weights.h"

using namespace gpulab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string fixture = std::string(GPULAB_TEST_DATA) + "/llama_tiny";
  static const llm::Tokenizer tokenizer = llm::Tokenizer::from_file(fixture);
  static const llm::WeightSource weights = llm::WeightSource::from_checkpoint(fixture);
  static const std::unique_ptr<llm::Engine> engine = llm::make_cpu_engine(weights, 4096, 1);
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const nlohmann::json body = nlohmann::json::parse(fuzz::as_text(data + 1, size - 1), nullptr, false);
  if (body.is_discarded()) return 0;
  llm::ServerOptions options;
  options.model_name = "tiny";
  options.max_prompt_tokens = 256;
  fuzz::refuse_or_pass([&] {
    llm::ParsedGeneration p = llm::parse_generation_body(body, chat, tokenizer, options);
    fuzz::check(static_cast<int64_t>(p.request.prompt.size()) <= options.max_prompt_tokens, "the prompt limit holds");
    fuzz::check(p.request.max_new_tokens >= 1, "max_tokens is positive");
    llm::Scheduler scheduler(*engine, tokenizer);  // not started: submit() validates and queues
    scheduler.submit(std::move(p.request));
  });
  return 0;
}
