// The OpenAI-compatible HTTP API over a Scheduler: /v1/completions and /v1/chat/completions
// (with `stream: true` as server-sent events), /v1/models, /health and /metrics (Prometheus).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/http_server.h"
#include "llm/scheduler.h"
#include "llm/tokenizer.h"

namespace gpulab::llm {

struct ServerOptions {
  std::string model_name;         // what /v1/models lists and requests may name (never a path)
  size_t max_waiting = 1024;      // requests queued beyond this get HTTP 429
  int64_t default_max_tokens = 16;
  std::string api_key;            // non-empty: every route but /health needs `Authorization: Bearer KEY`
  int64_t max_prompt_tokens = 0;  // > 0: longer prompts get HTTP 400 (the context length applies anyway)
  bool log_prompts = false;       // request log lines carry the prompt text (off: counts only)
};

// One completion request as its JSON body describes it, validated (types, ranges, prompt length
// limit). Throws core::InputError with the message the client gets (HTTP 400).
struct ParsedGeneration {
  GenerationRequest request;
  bool stream = false;
  std::string prompt_text;  // the prompt as text (chat: formatted), for --log-prompts
};
ParsedGeneration parse_generation_body(const nlohmann::json& body, bool chat, const Tokenizer& tokenizer,
                                       const ServerOptions& options);

// Prompt text for chat messages in the model family's format: Llama-3 when the tokenizer knows
// `<|start_header_id|>`, otherwise Llama-2's `[INST]` format. Throws InputError on bad messages.
std::string format_chat(const Tokenizer& tokenizer, const nlohmann::json& messages);

// The server process's memory, for /metrics. The heap figures tell a leak from warm-up: a leak
// grows the bytes in use, while malloc's arenas keeping freed memory (one per thread at first,
// up to 8 per core) grow the resident set but only the free bytes.
struct ProcessMemory {
  int64_t resident_bytes = 0;     // 0 when unknown
  int64_t heap_in_use_bytes = 0;  // live malloc allocations, mmapped ones included (glibc mallinfo2)
  int64_t heap_free_bytes = 0;    // freed bytes malloc holds in its arenas, not returned to the system
};
ProcessMemory process_memory();

// Registers the API's routes on `server`. `scheduler` and `tokenizer` must outlive it.
void add_openai_routes(core::HttpServer& server, Scheduler& scheduler, const Tokenizer& tokenizer,
                       const ServerOptions& options);

}  // namespace gpulab::llm
