#include "llm/openai_server.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"

namespace gpulab::llm {

using nlohmann::json;

namespace {

std::atomic<uint64_t> g_request_counter{0};

// What travels from the scheduler thread to the HTTP thread of one request.
struct Channel {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<std::string> pieces;
  bool done = false;
  GenerationResult result;
};

core::HttpResponse error_response(int status, const std::string& message, const std::string& type) {
  return {status, "application/json", core::http_error_body(message, type), {}, {}};
}

json parse_body(const core::HttpRequest& req) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) throw core::InputError("the request body is not valid JSON");
  if (!body.is_object()) throw core::InputError("the request body must be a JSON object");
  return body;
}

const json* present(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong(const char* name, const std::string& what) {
  throw core::InputError(std::string("\"") + name + "\" must be " + what);
}

// Numbers are range-checked before conversion: a huge value is refused, never wrapped or cast.
int64_t int_field(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = present(body, name);
  if (!v) return fallback;
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))) wrong(name, range);
  const int64_t n = v->get<int64_t>();
  if (n < lo || n > hi) wrong(name, range);
  return n;
}

double float_field(const json& body, const char* name, double fallback, double lo, double hi) {
  const json* v = present(body, name);
  if (!v) return fallback;
  if (!v->is_number() || !(v->get<double>() >= lo && v->get<double>() <= hi))
    wrong(name, "a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v->get<double>();
}

bool bool_field(const json& body, const char* name, bool fallback) {
  const json* v = present(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) wrong(name, "true or false");
  return v->get<bool>();
}

std::vector<int32_t> token_ids(const json& prompt) {
  std::vector<int32_t> ids;
  for (const auto& id : prompt) {
    if (!id.is_number_integer()) throw core::InputError("\"prompt\" mixes token ids and other values");
    if (id.is_number_unsigned() ? id.get<uint64_t>() > INT32_MAX : id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      throw core::InputError("token id " + id.dump() + " is outside the vocabulary");
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

// JSON text of a reply; text that is not valid UTF-8 is replaced (U+FFFD), never a throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& chunk) { return "data: " + dump(chunk) + "\n\n"; }

}  // namespace

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  m.resident_bytes = resident * ::sysconf(_SC_PAGESIZE);
  const struct mallinfo2 heap = ::mallinfo2();
  m.heap_in_use_bytes = static_cast<int64_t>(heap.uordblks + heap.hblkhd);
  m.heap_free_bytes = static_cast<int64_t>(heap.fordblks);
  return m;
}

std::string format_chat(const Tokenizer& tokenizer, const json& messages) {
  if (!messages.is_array() || messages.empty()) throw core::InputError("\"messages\" must be a non-empty list");
  std::vector<std::pair<std::string, std::string>> turns;
  for (const auto& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") || !m["content"].is_string())
      throw core::InputError("each message needs a string \"role\" and a string \"content\"");
    const std::string role = m["role"];
    if (role != "system" && role != "user" && role != "assistant")
      throw core::InputError("message role \"" + role + "\" is not system, user or assistant");
    turns.emplace_back(role, m["content"]);
  }
  std::string out;
  if (tokenizer.token_id("<|start_header_id|>")) {  // Llama 3
    out = "<|begin_of_text|>";
    for (const auto& [role, content] : turns)
      out += "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + content + "<|eot_id|>";
    return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  // Llama 2: [INST] blocks, the system prompt folded into the first user turn.
  std::string system;
  bool open = false;
  for (const auto& [role, content] : turns) {
    if (role == "system") {
      system = "<<SYS>>\n" + content + "\n<</SYS>>\n\n";
    } else if (role == "user") {
      out += "<s>[INST] " + system + content + " [/INST]";
      system.clear();
      open = true;
    } else {
      out += " " + content + " </s>";
      open = false;
    }
  }
  if (!open) throw core::InputError("the last message must come from the user");
  return out;
}

// OpenAI parameters this server does not implement are refused (400, naming the parameter), not
// ignored: a client asking for several choices, log-probabilities, penalties or tool calls would
// otherwise get an answer that silently differs from what it asked for. Their neutral values pass,
// since many clients send them by default.
void refuse_unimplemented(const json& body) {
  const auto number_is = [&](const char* name, double neutral, const char* what) {
    const json* v = present(body, name);
    if (v && !(v->is_number() && v->get<double>() == neutral)) wrong(name, what);
  };
  number_is("n", 1, "1 (this server returns one choice a request)");
  number_is("best_of", 1, "1 (this server returns one choice a request)");
  number_is("presence_penalty", 0, "0 (penalties are not implemented)");
  number_is("frequency_penalty", 0, "0 (penalties are not implemented)");
  number_is("repetition_penalty", 1, "1 (penalties are not implemented)");
  number_is("top_logprobs", 0, "0 (log-probabilities are not implemented)");
  if (const json* v = present(body, "logprobs"); v && *v != false && *v != 0)
    wrong("logprobs", "false or 0 (log-probabilities are not implemented)");
  if (const json* v = present(body, "echo"); v && *v != false) wrong("echo", "false (echo is not implemented)");
  if (const json* v = present(body, "logit_bias"); v && !v->empty()) wrong("logit_bias", "empty (not implemented)");
  if (const json* v = present(body, "suffix"); v && *v != "") wrong("suffix", "empty (insertion is not implemented)");
  for (const char* name : {"tools", "functions"})
    if (const json* v = present(body, name); v && !v->empty()) wrong(name, "empty (tool calls are not implemented)");
  if (const json* v = present(body, "response_format"); v && !(v->is_object() && v->contains("type") && v->at("type") == "text"))
    wrong("response_format", "{\"type\": \"text\"} (JSON mode is not implemented)");
}

ParsedGeneration parse_generation_body(const json& body, bool chat, const Tokenizer& tokenizer,
                                       const ServerOptions& options) {
  if (!body.is_object()) throw core::InputError("the request body must be a JSON object");
  refuse_unimplemented(body);
  ParsedGeneration p;
  GenerationRequest& r = p.request;
  p.stream = bool_field(body, "stream", false);
  r.stop_at_eos = !bool_field(body, "ignore_eos", false);  // vLLM's extension: fixed lengths for load tests
  constexpr int64_t kMaxTokens = int64_t{1} << 40;  // beyond any context; keeps sums far from overflow
  r.max_new_tokens = int_field(body, "max_tokens", int_field(body, "max_completion_tokens", options.default_max_tokens, 1, kMaxTokens),
                               1, kMaxTokens);
  r.sampling.temperature = static_cast<float>(float_field(body, "temperature", 1.0, 0.0, 1e6));
  r.sampling.top_p = static_cast<float>(float_field(body, "top_p", 1.0, 0.0, 1.0));
  r.sampling.top_k = static_cast<int>(int_field(body, "top_k", 0, 0, INT32_MAX));
  if (const json* seed = present(body, "seed")) {
    if (!seed->is_number_integer() || (!seed->is_number_unsigned() && seed->get<int64_t>() < 0))
      wrong("seed", "a non-negative integer");
    r.sampling.seed = seed->get<uint64_t>();
  } else {
    r.sampling.seed = g_request_counter.load();
  }
  validate(r.sampling);
  if (const json* stop = present(body, "stop")) {
    const bool list = stop->is_array() && std::all_of(stop->begin(), stop->end(), [](const json& s) { return s.is_string(); });
    if (!stop->is_string() && !list) wrong("stop", "a string or a list of strings");
    if (stop->is_string()) r.stop.push_back(stop->get<std::string>());
    else for (const auto& s : *stop) r.stop.push_back(s.get<std::string>());
  }
  if (chat) {
    if (!body.contains("messages")) throw core::InputError("\"messages\" is required");
    p.prompt_text = format_chat(tokenizer, body["messages"]);
    r.prompt = tokenizer.encode(p.prompt_text, false);
  } else {
    if (!body.contains("prompt")) throw core::InputError("\"prompt\" is required");
    const json& prompt = body["prompt"];
    if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
      r.prompt = token_ids(prompt);
      p.prompt_text = prompt.dump();
    } else {
      if (prompt.is_string()) p.prompt_text = prompt.get<std::string>();
      else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) p.prompt_text = prompt[0].get<std::string>();
      else throw core::InputError("\"prompt\" must be a string, one string in a list, or a list of token ids");
      r.prompt = tokenizer.encode(p.prompt_text, true);
    }
  }
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (options.max_prompt_tokens > 0 && n > options.max_prompt_tokens)
    throw core::InputError("the prompt is " + std::to_string(n) + " tokens, more than this server's limit of " +
                           std::to_string(options.max_prompt_tokens) + " (--max-prompt-tokens)");
  return p;
}

void add_openai_routes(core::HttpServer& server, Scheduler& scheduler, const Tokenizer& tokenizer,
                       const ServerOptions& options) {
  // With an API key every route but /health (for load balancers' probes) checks
  // `Authorization: Bearer KEY`, compared in constant time.
  auto route = [&server, key = options.api_key](const std::string& method, const std::string& path, core::HttpHandler handler) {
    if (key.empty()) return server.route(method, path, std::move(handler));
    server.route(method, path, [key, handler = std::move(handler)](const core::HttpRequest& req) {
      auto auth = req.headers.find("authorization");
      const std::string_view given = auth == req.headers.end() ? std::string_view() : std::string_view(auth->second);
      if (!given.starts_with("Bearer ") || !core::constant_time_equal(given.substr(7), key))
        return core::HttpResponse{401, "application/json",
                                  core::http_error_body("invalid or missing API key: send `Authorization: Bearer KEY`",
                                                        "authentication_error"),
                                  {{"WWW-Authenticate", "Bearer"}}, {}};
      return handler(req);
    });
  };
  server.route("GET", "/health", [](const core::HttpRequest&) {
    return core::HttpResponse{200, "application/json", R"({"status":"ok"})", {}, {}};
  });

  route("GET", "/v1/models", [options](const core::HttpRequest&) {
    const json body = {{"object", "list"},
                       {"data", {{{"id", options.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "gpulab"}}}}};
    return core::HttpResponse{200, "application/json", dump(body), {}, {}};
  });

  route("GET", "/metrics", [&scheduler](const core::HttpRequest&) {
    const SchedulerMetrics m = scheduler.metrics();
    std::ostringstream out;
    auto metric = [&out](const char* name, const char* type, const char* help, auto value) {
      out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << value << "\n";
    };
    metric("gpulab_requests_total", "counter", "Requests accepted.", m.requests_total);
    metric("gpulab_requests_finished_total", "counter", "Requests finished (stop or length).", m.requests_finished);
    metric("gpulab_requests_cancelled_total", "counter", "Requests cancelled (client gone).", m.requests_cancelled);
    metric("gpulab_requests_running", "gauge", "Requests in the running batch.", m.running);
    metric("gpulab_requests_waiting", "gauge", "Requests queued for KV room.", m.waiting);
    metric("gpulab_prompt_tokens_total", "counter", "Prompt tokens accepted.", m.prompt_tokens_total);
    metric("gpulab_generated_tokens_total", "counter", "Tokens generated.", m.generated_tokens_total);
    metric("gpulab_kv_capacity_tokens", "gauge", "KV cache capacity in tokens.", m.kv_capacity_tokens);
    metric("gpulab_kv_used_tokens", "gauge", "KV cache tokens reserved by running requests.", m.kv_capacity_tokens - m.kv_free_tokens);
    metric("gpulab_steps_total", "counter", "Engine steps run.", m.steps);
    metric("gpulab_step_rows_total", "counter", "Tokens fed to the engine (prompt chunks and decodes).", m.step_rows);
    metric("gpulab_engine_seconds_total", "counter", "Wall time inside engine steps.", m.engine_seconds);
    metric("gpulab_step_seconds_total", "counter", "Wall time of whole steps (engine, sampling, text).",
           m.step_seconds);
    const ProcessMemory memory = process_memory();
    metric("process_resident_memory_bytes", "gauge", "Resident memory of the server process.", memory.resident_bytes);
    metric("process_heap_in_use_bytes", "gauge", "Bytes of live malloc allocations.", memory.heap_in_use_bytes);
    metric("process_heap_free_bytes", "gauge", "Freed bytes malloc keeps in its arenas.", memory.heap_free_bytes);
    return core::HttpResponse{200, "text/plain; version=0.0.4", out.str(), {}, {}};
  });

  // Both endpoints share everything but how the prompt is built and how choices look.
  auto generation_route = [&scheduler, &tokenizer, options](bool chat) {
    return [&scheduler, &tokenizer, options, chat](const core::HttpRequest& req) -> core::HttpResponse {
      const json body = parse_body(req);
      if (body.contains("model") && body["model"].is_string() && body["model"] != options.model_name &&
          !options.model_name.empty())
        return error_response(404, "model \"" + body["model"].get<std::string>() + "\" is not served here (this server has \"" +
                                       options.model_name + "\")", "not_found_error");
      ParsedGeneration p = parse_generation_body(body, chat, tokenizer, options);
      if (scheduler.metrics().waiting >= static_cast<int64_t>(options.max_waiting))
        return error_response(429, "the server is busy: too many queued requests, retry later", "rate_limit_error");

      const uint64_t number = ++g_request_counter;
      const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(number);
      const int64_t created = std::time(nullptr);
      const std::string object = chat ? "chat.completion" : "text_completion";
      auto channel = std::make_shared<Channel>();
      auto cancelled = p.request.cancelled;
      p.request.on_text = [channel](const std::string& piece) {
        std::lock_guard lock(channel->mutex);
        channel->pieces.push_back(piece);
        channel->ready.notify_one();
        return true;
      };
      // Prompt text reaches the log only when the operator asked (--log-prompts).
      const std::string logged_prompt = options.log_prompts ? p.prompt_text : std::string();
      p.request.on_done = [channel, id, logged_prompt, log_prompts = options.log_prompts](const GenerationResult& r) {
        const auto level = log_prompts ? core::LogLevel::info : core::LogLevel::debug;
        core::log(level, id, ": ", r.finish_reason, ", ", r.prompt_tokens, " prompt + ", r.tokens.size(),
                  " generated tokens, first token ", r.ttft_ms, " ms, total ", r.total_ms, " ms",
                  log_prompts ? ", prompt " + dump(json(logged_prompt)) : std::string());
        std::lock_guard lock(channel->mutex);
        channel->result = r;
        channel->done = true;
        channel->ready.notify_one();
      };
      scheduler.submit(std::move(p.request));

      auto usage = [](const GenerationResult& r) {
        const int64_t completion = static_cast<int64_t>(r.tokens.size());
        return json{{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", completion},
                    {"total_tokens", r.prompt_tokens + completion}};
      };
      const std::string model = options.model_name;

      if (!p.stream) {
        std::unique_lock lock(channel->mutex);
        channel->ready.wait(lock, [&] { return channel->done; });
        const GenerationResult& r = channel->result;
        json choice = {{"index", 0}, {"finish_reason", r.finish_reason}, {"logprobs", nullptr}};
        if (chat) choice["message"] = {{"role", "assistant"}, {"content", r.text}};
        else choice["text"] = r.text;
        const json out = {{"id", id}, {"object", object}, {"created", created}, {"model", model},
                          {"choices", json::array({choice})}, {"usage", usage(r)}};
        return {200, "application/json", dump(out), {}, {}};
      }

      core::HttpResponse res{200, "text/event-stream", "", {}, {}};
      res.stream = [channel, cancelled, chat, id, created, model, usage](core::HttpStream& out) {
        const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
        auto chunk = [&](const std::string& text, const json& finish) {
          json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
          if (chat) choice["delta"] = text.empty() && !finish.is_null() ? json::object() : json{{"content", text}};
          else choice["text"] = text;
          return json{{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                      {"choices", json::array({choice})}};
        };
        if (chat && !out.write(sse(json{{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                                        {"choices", {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                      {"finish_reason", nullptr}}}}}))) {
          *cancelled = true;
          return;
        }
        for (;;) {
          std::unique_lock lock(channel->mutex);
          channel->ready.wait(lock, [&] { return channel->done || !channel->pieces.empty(); });
          std::deque<std::string> pieces;
          pieces.swap(channel->pieces);
          const bool done = channel->done;
          const GenerationResult result = done ? channel->result : GenerationResult{};
          lock.unlock();
          for (const auto& piece : pieces) {
            if (piece.empty()) continue;
            if (!out.write(sse(chunk(piece, nullptr)))) {
              *cancelled = true;  // the client left: free its KV room at the next step
              return;
            }
          }
          if (done) {
            json last = chunk("", result.finish_reason);
            last["usage"] = usage(result);
            out.write(sse(last));
            out.write("data: [DONE]\n\n");
            return;
          }
        }
      };
      return res;
    };
  };
  route("POST", "/v1/completions", generation_route(false));
  route("POST", "/v1/chat/completions", generation_route(true));
}

}  // namespace gpulab::llm
