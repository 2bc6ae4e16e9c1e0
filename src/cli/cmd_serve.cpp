// gpulab serve: the OpenAI-compatible HTTP API over continuous batching.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <pthread.h>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/http_server.h"
#include "core/log.h"
#include "llm/openai_server.h"

namespace gpulab::cli {

namespace {

struct ServeOptions {
  ModelOptions model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_name;
  int64_t prefill_chunk = 512;
  int64_t step_prefill_tokens = 2048;
  std::string api_key;
  int64_t max_prompt_tokens = 0;
  size_t max_body_bytes = 8 << 20;
  bool log_prompts = false;
};

int run_serve(const ServeOptions& opt) {
  // SIGINT/SIGTERM are taken by sigwait below; block them before any thread starts so that
  // every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const llm::Tokenizer tokenizer = load_tokenizer(opt.model);
  const llm::WeightSource weights = load_weights(opt.model);
  // A small test tokenizer over a full-size dummy vocabulary leaves most sampled ids without
  // text, so streams carry little of what is generated.
  if (const int64_t covered = tokenizer.vocab_size(), ids = weights.config().vocab_size; covered < ids / 2)
    core::log_warn("gpulab serve: the tokenizer has text for ", covered, " of the model's ", ids,
                   " token ids; the others decode to nothing");
  auto engine = llm::make_engine(weights, opt.model.engine);
  llm::Scheduler scheduler(*engine, tokenizer,
                           {.max_batch = opt.model.engine.cuda.max_batch,
                            .prefill_chunk = opt.prefill_chunk,
                            .step_prefill_tokens = opt.step_prefill_tokens});
  scheduler.start();

  llm::ServerOptions server_options;
  server_options.model_name = !opt.served_name.empty() ? opt.served_name
                              : !opt.model.model.empty() ? std::filesystem::path(opt.model.model).filename().string()
                                                         : opt.model.config;
  if (server_options.model_name.empty())
    server_options.model_name = std::filesystem::path(opt.model.model).parent_path().filename().string();
  server_options.api_key = opt.api_key;
  server_options.max_prompt_tokens = opt.max_prompt_tokens;
  server_options.log_prompts = opt.log_prompts;
  core::HttpLimits limits;
  limits.max_body_bytes = opt.max_body_bytes;
  core::HttpServer server(limits);
  llm::add_openai_routes(server, scheduler, tokenizer, server_options);
  server.start(opt.host, opt.port);
  core::log_info("gpulab serve: model \"", server_options.model_name, "\" on ", engine->device_name(), ", listening on http://",
                 opt.host, ":", server.port(), " (KV room ", engine->kv_capacity_tokens(), " tokens); Ctrl-C or SIGTERM stops");
  if (opt.api_key.empty() && opt.host != "127.0.0.1")
    core::log_warn("gpulab serve: listening beyond loopback without an API key (--api-key or GPULAB_API_KEY)");

  int sig = 0;
  sigwait(&signals, &sig);
  core::log_info("gpulab serve: ", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                 ": no new connections; finishing requests in flight");
  server.stop();      // waits for open connections, whose requests the scheduler still runs
  scheduler.drain();
  scheduler.stop();
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<ServeOptions>();
  auto* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, streaming) with continuous batching");
  add_model_options(*sub, opt->model);
  sub->add_option("--host", opt->host, "IPv4 address to listen on (0.0.0.0: every interface; consider --api-key)")->capture_default_str();
  sub->add_option("--port", opt->port, "TCP port (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  sub->add_option("--max-batch", opt->model.engine.cuda.max_batch, "Most requests in one engine step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--served-model-name", opt->served_name, "Model name clients use (default: the model folder's name)");
  sub->add_option("--prefill-chunk", opt->prefill_chunk, "Prompt tokens a request feeds per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--step-prefill-tokens", opt->step_prefill_tokens,
                  "Prompt tokens all requests feed in one step together (whole chunks, at least one): "
                  "bounds a step, so streams already decoding keep their pace while long prompts arrive")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_flag("--pack-prefill", opt->model.engine.cuda.pack_chunks,
                "With --device cuda: the prompt chunks of a step share forward passes (one weight read for many "
                "prompts) instead of one pass each; more throughput under load, but a request's tokens may then "
                "differ within bf16 rounding with the prompts it arrives beside");
  sub->add_option("--api-key", opt->api_key,
                  "Require `Authorization: Bearer KEY` on every route but /health (or set GPULAB_API_KEY)")
      ->envname("GPULAB_API_KEY");
  sub->add_option("--max-prompt-tokens", opt->max_prompt_tokens, "Longer prompts get HTTP 400 (0: the context length only)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--max-body-bytes", opt->max_body_bytes, "Larger request bodies get HTTP 413")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_flag("--log-prompts", opt->log_prompts, "Log each request with its prompt text (off: counts and times only)");
  sub->footer(
      "Endpoints: POST /v1/completions, POST /v1/chat/completions (\"stream\": true for server-sent events),\n"
      "GET /v1/models, GET /health, GET /metrics (Prometheus).\n"
      "Example:\n  gpulab serve --model ~/models/Llama-3-8B-Instruct --device cuda --port 8000\n"
      "  curl localhost:8000/v1/completions -d '{\"prompt\": \"Hello\", \"max_tokens\": 32}'");
  sub->callback([&run, opt] { run = [opt] { return run_serve(*opt); }; });
}

}  // namespace gpulab::cli
