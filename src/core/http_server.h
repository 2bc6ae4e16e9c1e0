// A small HTTP/1.1 server for `gpulab serve`: one thread per connection (capped), persistent
// connections, Content-Length bodies, and streamed responses (server-sent events) that learn
// when the client has gone. Written here rather than taken from a library because the GPU
// machine has no packaged HTTP library whose headers build without OpenSSL's.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <thread>

namespace gpulab::core {

struct HttpRequest {
  std::string method;  // "GET", "POST"
  std::string path;    // without the query string
  std::string query;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// Writes the body of a streamed response; write() returns false once the client is gone.
class HttpStream {
 public:
  explicit HttpStream(int fd) : fd_(fd) {}
  bool write(const std::string& data);
  bool open() const { return open_; }

 private:
  int fd_;
  bool open_ = true;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::map<std::string, std::string> headers;
  // When set, the body is produced by this function after the headers (no Content-Length; the
  // connection closes at the end), e.g. `text/event-stream`.
  std::function<void(HttpStream&)> stream;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpLimits {
  size_t max_header_bytes = 64 << 10;
  size_t max_body_bytes = 8 << 20;
  int max_connections = 1024;
  int idle_timeout_seconds = 30;
};

// The request line and headers of one request (the bytes before the blank line), parsed and
// checked against the limits; the body is read after it.
struct HttpRequestHead {
  HttpRequest request;   // method, path, query, headers; body empty
  std::string version;   // "HTTP/1.1"
  size_t body_bytes = 0; // from Content-Length
  bool keep_alive = false;
  int error_status = 0;  // non-zero: answer this status with `error` and close the connection
  std::string error;
};
HttpRequestHead parse_request_head(std::string_view head, const HttpLimits& limits);

// The OpenAI-style error body: {"error": {"message", "type", "param", "code"}}.
std::string http_error_body(const std::string& message, const std::string& type = "invalid_request_error");

// Equality whose time depends only on the lengths, not on where the strings differ (API keys).
bool constant_time_equal(std::string_view a, std::string_view b);

class HttpServer {
 public:
  explicit HttpServer(HttpLimits limits = {}) : limits_(limits) {}
  ~HttpServer();

  // Routes match the method and the exact path. Unknown path: 404; known path, other method: 405.
  void route(const std::string& method, const std::string& path, HttpHandler handler);

  // Binds host:port (port 0 picks a free one) and starts accepting on a background thread.
  // Throws core::Error when the address cannot be bound.
  void start(const std::string& host, int port);
  int port() const { return port_; }
  // Stops accepting new connections, then waits for open ones to finish their current request.
  void stop();
  int open_connections() const { return connections_; }

 private:
  void accept_loop();
  void serve_connection(int fd);
  HttpResponse dispatch(const HttpRequest& request) const;

  HttpLimits limits_;
  std::map<std::string, std::map<std::string, HttpHandler>> routes_;  // path -> method -> handler
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::thread accept_thread_;
};

// Reason phrase of a status code ("Not Found").
const char* http_reason(int status);

}  // namespace gpulab::core
