// `serve`'s security and limits on the CPU engine: API key, body and prompt limits, model names
// that look like paths, requests beyond the KV room, malformed bytes that must not crash it, and
// requests that must leave no memory behind.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common/http_client.h"
#include "core/error.h"
#include "core/http_server.h"
#include "fixtures.h"
#include "llm/engine.h"
#include "llm/openai_server.h"
#include "llm/scheduler.h"

using namespace gpulab;
using namespace gpulab::llm;
using gpulab::testing::http_request;
using nlohmann::json;

namespace {

// The tiny fixture behind a server with the given options, KV room and HTTP limits.
class Served {
 public:
  Served(ServerOptions options, int64_t kv_tokens = 4096, core::HttpLimits limits = {}) : server_(limits) {
    weights_ = std::make_unique<WeightSource>(WeightSource::from_checkpoint(llm::testing::fixture_dir("llama_tiny")));
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_file(llm::testing::fixture_dir("llama_tiny")));
    engine_ = make_cpu_engine(*weights_, kv_tokens, 2);
    scheduler_ = std::make_unique<Scheduler>(*engine_, *tokenizer_);
    scheduler_->start();
    add_openai_routes(server_, *scheduler_, *tokenizer_, options);
    server_.start("127.0.0.1", 0);
  }
  ~Served() {
    server_.stop();
    scheduler_->stop();
  }
  int port() const { return server_.port(); }
  Scheduler& scheduler() { return *scheduler_; }
  // Blocks until no request runs or waits and every connection's thread is done.
  void wait_idle() {
    scheduler_->drain();
    while (server_.open_connections() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

 private:
  std::unique_ptr<WeightSource> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Scheduler> scheduler_;
  core::HttpServer server_;
};

json error_of(const gpulab::testing::HttpReply& r) {
  const json j = json::parse(r.body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.body;
  EXPECT_TRUE(j.contains("error") && j["error"].contains("message") && j["error"]["message"].is_string()) << r.body;
  return j.is_discarded() ? json::object() : j["error"];
}

ServerOptions named_tiny(size_t max_waiting = 1024) {
  ServerOptions options;
  options.model_name = "tiny";
  options.max_waiting = max_waiting;
  return options;
}

const std::string kCompletion = R"({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})";

}  // namespace

TEST(ServeLimits, ConstantTimeEqualIsEquality) {
  EXPECT_TRUE(core::constant_time_equal("", ""));
  EXPECT_TRUE(core::constant_time_equal("s3cret-key", "s3cret-key"));
  EXPECT_FALSE(core::constant_time_equal("s3cret-key", "s3cret-kez"));
  EXPECT_FALSE(core::constant_time_equal("s3cret-key", "s3cret-ke"));
  EXPECT_FALSE(core::constant_time_equal("s3cret-ke", "s3cret-key"));
  EXPECT_FALSE(core::constant_time_equal("", "x"));
  EXPECT_FALSE(core::constant_time_equal(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(ServeLimits, ApiKeyGuardsEveryRouteButHealth) {
  ServerOptions options = named_tiny();
  options.api_key = "s3cret-key";
  Served s(options);
  EXPECT_EQ(http_request(s.port(), "GET", "/health").status, 200);
  const std::string good = "Authorization: Bearer s3cret-key\r\n";
  for (const std::string& headers : {std::string(), std::string("Authorization: Bearer s3cret-kez\r\n"),
                                     std::string("Authorization: Bearer s3cret-ke\r\n"), std::string("Authorization: s3cret-key\r\n"),
                                     std::string("Authorization: Basic s3cret-key\r\n")}) {
    for (const auto& [method, path] : {std::pair{"GET", "/v1/models"}, {"GET", "/metrics"}, {"POST", "/v1/completions"},
                                       {"POST", "/v1/chat/completions"}}) {
      const auto r = http_request(s.port(), method, path, std::string(method) == "POST" ? kCompletion : "", headers);
      EXPECT_EQ(r.status, 401) << path << " with " << headers;
      EXPECT_EQ(error_of(r)["type"].get<std::string>(), "authentication_error");
      EXPECT_NE(r.headers.find("WWW-Authenticate: Bearer"), std::string::npos) << r.headers;
    }
  }
  EXPECT_EQ(http_request(s.port(), "GET", "/v1/models", "", good).status, 200);
  EXPECT_EQ(http_request(s.port(), "GET", "/metrics", "", good).status, 200);
  const auto r = http_request(s.port(), "POST", "/v1/completions", kCompletion, good);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"].get<int>(), 4);
}

TEST(ServeLimits, BodyOverTheLimitIs413) {
  core::HttpLimits limits;
  limits.max_body_bytes = 4096;
  Served s(named_tiny(), 4096, limits);
  const std::string big = R"({"prompt": ")" + std::string(5000, 'a') + R"(", "max_tokens": 1})";
  const auto r = http_request(s.port(), "POST", "/v1/completions", big);
  EXPECT_EQ(r.status, 413) << r.body;
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("4096 bytes"), std::string::npos) << r.body;
  EXPECT_EQ(http_request(s.port(), "POST", "/v1/completions", kCompletion).status, 200);  // still serving
}

TEST(ServeLimits, PromptOverTheTokenLimitIs400) {
  ServerOptions options = named_tiny();
  options.max_prompt_tokens = 8;
  Served s(options);
  const auto text = http_request(s.port(), "POST", "/v1/completions",
                                 R"({"prompt": "one two three four five six seven eight nine ten eleven", "max_tokens": 1})");
  EXPECT_EQ(text.status, 400);
  EXPECT_NE(error_of(text)["message"].get<std::string>().find("--max-prompt-tokens"), std::string::npos) << text.body;
  EXPECT_EQ(http_request(s.port(), "POST", "/v1/completions", R"({"prompt": [1,2,3,4,5,6,7,8,9], "max_tokens": 1})").status, 400);
  EXPECT_EQ(http_request(s.port(), "POST", "/v1/completions", R"({"prompt": [1,2,3,4,5,6,7,8], "max_tokens": 1})").status, 200);
  const auto chat = http_request(s.port(), "POST", "/v1/chat/completions",
                                 R"({"messages": [{"role": "user", "content": "a long question with many words in it"}]})");
  EXPECT_EQ(chat.status, 400) << chat.body;
}

TEST(ServeLimits, OutOfRangeNumbersAre400NotWrapped) {
  Served s(named_tiny());
  for (const char* body :
       {R"({"prompt": "a", "max_tokens": 9223372036854775807})", R"({"prompt": "a", "max_tokens": 18446744073709551615})",
        R"({"prompt": "a", "max_tokens": -1})", R"({"prompt": [4294967297], "max_tokens": 1})", R"({"prompt": [-1]})",
        R"({"prompt": "a", "temperature": 1e300})", R"({"prompt": "a", "top_k": 4294967296})",
        R"({"prompt": "a", "top_p": 2})", R"({"prompt": "a", "seed": -1})", R"({"prompt": "a", "stream": 1})",
        R"({"prompt": "a", "stop": [1]})", R"({"prompt": []})", "[1]", "{", ""}) {
    const auto r = http_request(s.port(), "POST", "/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    error_of(r);
  }
}

TEST(ServeLimits, ModelNamesAreNamesNotPaths) {
  Served s(named_tiny());
  for (const char* name : {"../../../../etc/passwd", "/etc/passwd", "tiny/../tiny", "./tiny"}) {
    const auto r = http_request(s.port(), "POST", "/v1/completions", json{{"model", name}, {"prompt", "a"}, {"max_tokens", 1}}.dump());
    EXPECT_EQ(r.status, 404) << name;
    EXPECT_EQ(error_of(r)["type"].get<std::string>(), "not_found_error");
  }
  const auto r = http_request(s.port(), "POST", "/v1/completions", R"({"model": "tiny", "prompt": "a", "max_tokens": 1})");
  EXPECT_EQ(r.status, 200);
}

TEST(ServeLimits, MalformedRequestBytesGetJsonErrors) {
  Served s(named_tiny());
  auto raw = [&](const std::string& request) {
    const int fd = gpulab::testing::http_connect(s.port());
    EXPECT_GE(fd, 0);
    ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    auto r = gpulab::testing::http_read(fd);
    ::close(fd);
    return r;
  };
  auto r = raw("GET /no\xff\x01route HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.status, 404);
  error_of(r);  // valid JSON although the path is not UTF-8
  EXPECT_EQ(raw("POST /v1/completions HTTP/1.1\r\nContent-Length: 12x\r\n\r\n").status, 400);
  EXPECT_EQ(raw("POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n").status, 400);
  EXPECT_EQ(raw("POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").status, 411);
  EXPECT_EQ(raw("BLAH\r\n\r\n").status, 400);
  EXPECT_EQ(http_request(s.port(), "GET", "/health").status, 200);
}

// More work than the KV room holds at once: requests wait for room (or get 429 when the queue is
// full), every answered request completes, and the KV room is free again at the end.
TEST(ServeLimits, BeyondKvCapacityRequestsWaitOr429) {
  ServerOptions options = named_tiny(3);  // at most 3 queued
  const int64_t kv_tokens = 96;           // room for about three requests at once
  Served s(options, kv_tokens);
  const std::string body = R"({"prompt": "Once upon a time there was", "max_tokens": 24, "temperature": 0})";
  std::vector<std::future<gpulab::testing::HttpReply>> replies;
  for (int i = 0; i < 16; ++i)
    replies.push_back(std::async(std::launch::async, [&] { return http_request(s.port(), "POST", "/v1/completions", body); }));
  int ok = 0, busy = 0;
  for (auto& f : replies) {
    const auto r = f.get();
    if (r.status == 200) {
      ++ok;
      EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"].get<int>(), 24);
    } else {
      EXPECT_EQ(r.status, 429) << r.body;
      EXPECT_EQ(error_of(r)["type"].get<std::string>(), "rate_limit_error");
      ++busy;
    }
  }
  EXPECT_GE(ok, 3);
  EXPECT_EQ(ok + busy, 16);
  // One request that can never fit is refused at once, not queued forever.
  const auto huge = http_request(s.port(), "POST", "/v1/completions", R"({"prompt": "a", "max_tokens": 200})");
  EXPECT_EQ(huge.status, 400) << huge.body;
  s.scheduler().drain();
  const SchedulerMetrics m = s.scheduler().metrics();
  EXPECT_EQ(m.kv_free_tokens, m.kv_capacity_tokens);
  EXPECT_EQ(m.running + m.waiting, 0);
}

// crash_max_tokens_zero in the fuzz corpus: 0 passed the range check (it parses as an unsigned
// JSON number) and was refused only later by the scheduler; the body parser refuses it itself.
TEST(ServeLimits, BodyParserChecksTheLowerBoundOfNonNegativeNumbers) {
  const Tokenizer tokenizer = Tokenizer::from_file(llm::testing::fixture_dir("llama_tiny"));
  for (const char* body : {R"({"prompt": "a", "max_tokens": 0})", R"({"prompt": "a", "max_completion_tokens": 0})"}) {
    try {
      parse_generation_body(json::parse(body), false, tokenizer, named_tiny());
      ADD_FAILURE() << body << " was accepted";
    } catch (const gpulab::core::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("must be an integer in [1, "), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_generation_body(json::parse(R"({"prompt": "a", "max_tokens": 1})"), false, tokenizer, named_tiny())
                .request.max_new_tokens,
            1);
}

namespace {

// Whether malloc's statistics (mallinfo2) see this process's heap: AddressSanitizer's allocator
// replaces glibc's, whose statistics then read 0 (CI runs the cpu tests under it too).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMallocStatistics = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kMallocStatistics = false;
#else
constexpr bool kMallocStatistics = true;
#endif
#else
constexpr bool kMallocStatistics = true;
#endif

// A gauge of /metrics, in bytes; -1 when absent.
int64_t metric_of(int port, const std::string& name) {
  const std::string text = http_request(port, "GET", "/metrics").body;
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stoll(text.substr(at + name.size() + 2));
}

// Request `i` of a fixed mix: completion or chat, streamed or not, greedy or sampled (the
// sampler's vocabulary-sized scratch), and every fifth stream left by its client after the
// first piece (the request is cancelled).
void mixed_request(int port, int i) {
  const bool chat = i % 2 == 1, stream = i % 3 != 0, leave = stream && i % 5 == 0;
  const std::string text = std::string("Once upon a time ") + (i % 4 ? "there was a king" : "in a far land");
  json body = {{"max_tokens", 4 + i % 3 * 6}, {"temperature", i % 4 < 2 ? 0.0 : 0.8}, {"stream", stream}};
  if (chat) body["messages"] = {{{"role", "user"}, {"content", text}}};
  else body["prompt"] = text;
  const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
  if (!leave) {
    const auto r = http_request(port, "POST", path, body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return;
  }
  const int fd = gpulab::testing::http_connect(port);
  ASSERT_GE(fd, 0);
  gpulab::testing::http_send(fd, "POST", path, body.dump());
  std::string got;
  char buf[512];
  for (ssize_t n; got.find("data: ") == std::string::npos && (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  EXPECT_NE(got.find("data: "), std::string::npos) << got;
  ::close(fd);
}

}  // namespace

// /metrics reports the process's memory: a 64 MiB block held by this (the server's) process
// shows in the resident set and in the heap bytes in use, and leaves the latter when freed.
TEST(ServeLimits, MetricsReportResidentAndHeapMemory) {
  if (!kMallocStatistics) GTEST_SKIP() << "AddressSanitizer's allocator: malloc statistics read 0";
  Served s(named_tiny());
  constexpr int64_t kBlock = int64_t{64} << 20;
  const int64_t rss_before = metric_of(s.port(), "process_resident_memory_bytes");
  const int64_t heap_before = metric_of(s.port(), "process_heap_in_use_bytes");
  ASSERT_GT(rss_before, 0);
  ASSERT_GT(heap_before, 0);
  EXPECT_GE(metric_of(s.port(), "process_heap_free_bytes"), 0);
  auto block = std::make_unique<std::vector<char>>(kBlock, 'x');  // written: resident
  EXPECT_GE(metric_of(s.port(), "process_resident_memory_bytes") - rss_before, kBlock * 9 / 10);
  EXPECT_GE(metric_of(s.port(), "process_heap_in_use_bytes") - heap_before, kBlock);
  EXPECT_EQ((*block)[kBlock - 1], 'x');
  block.reset();
  EXPECT_LT(metric_of(s.port(), "process_heap_in_use_bytes") - heap_before, kBlock / 2);
}

// Whichever way a request ends (finished, streamed, cancelled by a client that left), its state
// goes with it: after a first round has warmed the server up (threads, caches), a round eight
// times larger of the same requests leaves the heap bytes in use where they were, give or take
// buffers growing to a larger batch than the first round's (logits: up to 8 rows of 4 KB;
// sampling scratch: 8 KB a sampling thread) and allocator noise (seen up to 38 KB). A request's
// state kept would add more than 1 KB a request: a leaked channel alone (queue, mutex, result)
// added 170 KB over 160 requests.
TEST(ServeLimits, RequestsLeaveNoLiveHeapBehind) {
  if (!kMallocStatistics) GTEST_SKIP() << "AddressSanitizer's allocator: malloc statistics read 0";
  Served s(named_tiny());
  auto round = [&](int requests) {
    std::vector<std::thread> clients;
    for (int c = 0; c < 8; ++c)
      clients.emplace_back([&, c] {
        for (int i = c; i < requests; i += 8) mixed_request(s.port(), i);
      });
    for (auto& t : clients) t.join();
    s.wait_idle();
    return process_memory().heap_in_use_bytes;
  };
  const SchedulerMetrics before = s.scheduler().metrics();
  const int64_t warm = round(40);
  const int64_t after = round(320);
  const SchedulerMetrics m = s.scheduler().metrics();
  EXPECT_EQ(m.requests_total - before.requests_total, 360);
  // 47 streams are left early; those that had finished by then count as finished.
  EXPECT_EQ(m.requests_finished + m.requests_cancelled - before.requests_finished - before.requests_cancelled, 360);
  EXPECT_LE(m.requests_cancelled - before.requests_cancelled, 47);
  EXPECT_EQ(m.kv_free_tokens, m.kv_capacity_tokens);
  EXPECT_LT(after - warm, 128 << 10) << "heap in use after the warm-up round " << warm << " B, after the second " << after << " B";
}
