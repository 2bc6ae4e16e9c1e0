#include "llm/openai_server.h"

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

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
  return {status, "application/json",
          json{{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}}.dump(), {}, {}};
}

json parse_body(const core::HttpRequest& req) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) throw core::InputError("the request body is not valid JSON");
  if (!body.is_object()) throw core::InputError("the request body must be a JSON object");
  return body;
}

template <class T>
T field(const json& body, const char* name, T fallback) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  try {
    return body[name].get<T>();
  } catch (const json::exception&) {
    throw core::InputError(std::string("\"") + name + "\" has the wrong type");
  }
}

struct Parsed {
  GenerationRequest request;
  bool stream = false;
};

Parsed parse_common(const json& body, const ServerOptions& options) {
  Parsed p;
  p.stream = field(body, "stream", false);
  p.request.max_new_tokens = field<int64_t>(body, "max_tokens", field<int64_t>(body, "max_completion_tokens", options.default_max_tokens));
  p.request.sampling.temperature = field(body, "temperature", 1.0f);
  p.request.sampling.top_p = field(body, "top_p", 1.0f);
  p.request.sampling.top_k = field(body, "top_k", 0);
  p.request.sampling.seed = field<uint64_t>(body, "seed", g_request_counter.load());
  validate(p.request.sampling);
  if (body.contains("stop") && !body["stop"].is_null()) {
    if (body["stop"].is_string()) p.request.stop.push_back(body["stop"]);
    else if (body["stop"].is_array()) {
      for (const auto& s : body["stop"]) {
        if (!s.is_string()) throw core::InputError("\"stop\" must be a string or a list of strings");
        p.request.stop.push_back(s);
      }
    } else throw core::InputError("\"stop\" must be a string or a list of strings");
  }
  return p;
}

std::string sse(const json& chunk) { return "data: " + chunk.dump() + "\n\n"; }

}  // namespace

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

void add_openai_routes(core::HttpServer& server, Scheduler& scheduler, const Tokenizer& tokenizer,
                       const ServerOptions& options) {
  server.route("GET", "/health", [](const core::HttpRequest&) {
    return core::HttpResponse{200, "application/json", R"({"status":"ok"})", {}, {}};
  });

  server.route("GET", "/v1/models", [options](const core::HttpRequest&) {
    const json body = {{"object", "list"},
                       {"data", {{{"id", options.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "gpulab"}}}}};
    return core::HttpResponse{200, "application/json", body.dump(), {}, {}};
  });

  server.route("GET", "/metrics", [&scheduler](const core::HttpRequest&) {
    const SchedulerMetrics m = scheduler.metrics();
    std::ostringstream out;
    auto metric = [&out](const char* name, const char* type, const char* help, int64_t value) {
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
      Parsed p = parse_common(body, options);
      if (chat) {
        if (!body.contains("messages")) throw core::InputError("\"messages\" is required");
        p.request.prompt = tokenizer.encode(format_chat(tokenizer, body["messages"]), false);
      } else {
        if (!body.contains("prompt")) throw core::InputError("\"prompt\" is required");
        const json& prompt = body["prompt"];
        if (prompt.is_string()) {
          p.request.prompt = tokenizer.encode(prompt.get<std::string>(), true);
        } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
          for (const auto& id : prompt) {
            if (!id.is_number_integer()) throw core::InputError("\"prompt\" mixes token ids and other values");
            p.request.prompt.push_back(id.get<int32_t>());
          }
        } else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
          p.request.prompt = tokenizer.encode(prompt[0].get<std::string>(), true);
        } else {
          throw core::InputError("\"prompt\" must be a string, one string in a list, or a list of token ids");
        }
      }
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
      p.request.on_done = [channel](const GenerationResult& r) {
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
        return {200, "application/json", out.dump(), {}, {}};
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
  server.route("POST", "/v1/completions", generation_route(false));
  server.route("POST", "/v1/chat/completions", generation_route(true));
}

}  // namespace gpulab::llm
