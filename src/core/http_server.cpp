#include "core/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace gpulab::core {

namespace {

bool send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::string head(const HttpResponse& r, bool keep_alive) {
  std::ostringstream out;
  out << "HTTP/1.1 " << r.status << " " << http_reason(r.status) << "\r\n";
  out << "Content-Type: " << r.content_type << "\r\n";
  for (const auto& [k, v] : r.headers) out << k << ": " << v << "\r\n";
  if (r.stream) {
    out << "Cache-Control: no-cache\r\nConnection: close\r\n\r\n";
  } else {
    out << "Content-Length: " << r.body.size() << "\r\n";
    out << (keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n") << "\r\n";
  }
  return out.str();
}

// Answers an error before the request was read to its end, then reads (and drops) what the
// client still sends for up to a second: closing with unread bytes would reset the connection,
// and the client could lose the answer.
void send_error(int fd, int status, const std::string& why) {
  const HttpResponse r{status, "application/json", http_error_body(why), {}, {}};
  const std::string out = head(r, false) + r.body;
  if (!send_all(fd, out.data(), out.size())) return;
  ::shutdown(fd, SHUT_WR);
  char sink[16384];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (pollfd p{fd, POLLIN, 0}; std::chrono::steady_clock::now() < until && ::poll(&p, 1, 100) >= 0;) {
    if (p.revents && ::recv(fd, sink, sizeof sink, 0) <= 0) break;
  }
}

// Reads from fd into buf until `pred` holds; false on timeout, close, error or stop.
template <class Pred>
bool read_until(int fd, std::string& buf, size_t limit, int timeout_s, const std::atomic<bool>& stopping, Pred pred) {
  char chunk[16384];
  while (!pred()) {
    if (buf.size() > limit) return false;
    pollfd p{fd, POLLIN, 0};
    int waited_ms = 0;
    int r = 0;
    // Wake every 200 ms to notice a stop between requests.
    while ((r = ::poll(&p, 1, 200)) == 0) {
      waited_ms += 200;
      if (stopping || waited_ms >= timeout_s * 1000) return false;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buf.append(chunk, static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

const char* http_reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

std::string http_error_body(const std::string& message, const std::string& type) {
  const nlohmann::json body = {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
  // Messages may quote request bytes (a path, a header): invalid UTF-8 becomes U+FFFD, not a throw.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of `b` is visited whatever `a` holds; only the lengths show in the time.
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < b.size(); ++i) diff |= static_cast<unsigned char>(i < a.size() ? a[i] : 0) ^ static_cast<unsigned char>(b[i]);
  return diff == 0;
}

HttpRequestHead parse_request_head(std::string_view head, const HttpLimits& limits) {
  HttpRequestHead out;
  HttpRequest& req = out.request;
  auto fail = [&](int status, std::string why) {
    out.error_status = status;
    out.error = std::move(why);
    return out;
  };
  const size_t line_end = std::min(head.find('\n'), head.size());
  std::istringstream first(std::string(head.substr(0, line_end)));
  std::string target;
  first >> req.method >> target >> out.version;
  if (req.method.empty() || target.empty() || target[0] != '/' || out.version.rfind("HTTP/1.", 0) != 0)
    return fail(400, "malformed request line");
  const size_t q = target.find('?');
  req.path = target.substr(0, q);
  if (q != std::string::npos) req.query = target.substr(q + 1);
  size_t pos = line_end;
  while (pos < head.size()) {
    const size_t begin = pos + 1;
    const size_t end = std::min(head.find('\n', begin), head.size());
    pos = end;
    const std::string line(head.substr(begin, end - begin));
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    req.headers[lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  }
  if (req.headers.count("transfer-encoding")) return fail(411, "chunked request bodies are not supported; send Content-Length");
  if (auto it = req.headers.find("content-length"); it != req.headers.end()) {
    const std::string& text = it->second;
    if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos)
      return fail(400, "bad Content-Length");
    const unsigned long long n = std::stoull(text);
    if (n > limits.max_body_bytes)
      return fail(413, "request body larger than the limit of " + std::to_string(limits.max_body_bytes) + " bytes");
    out.body_bytes = static_cast<size_t>(n);
  }
  auto connection = req.headers.find("connection");
  out.keep_alive = out.version == "HTTP/1.1" && (connection == req.headers.end() || lower(connection->second) != "close");
  return out;
}

bool HttpStream::write(const std::string& data) {
  if (open_ && !send_all(fd_, data.data(), data.size())) open_ = false;
  return open_;
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler) {
  routes_[path][method] = std::move(handler);
}

void HttpServer::start(const std::string& host, int port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw Error(std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    throw InputError("--host " + host + " is not an IPv4 address (e.g. 127.0.0.1 or 0.0.0.0)");
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 512) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(listen_fd_);
    listen_fd_ = -1;
    throw Error("cannot listen on " + host + ":" + std::to_string(port) + ": " + reason);
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  accept_thread_ = std::thread([this] { accept_loop(); });
}

void HttpServer::stop() {
  if (stopping_.exchange(true)) return;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  while (connections_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void HttpServer::accept_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (connections_ >= limits_.max_connections) {
      send_error(fd, 503, "too many connections");
      ::close(fd);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ++connections_;
    // Detached: stop() waits for the count of open connections to reach zero instead.
    std::thread([this, fd] {
      serve_connection(fd);
      ::close(fd);
      --connections_;
    }).detach();
  }
}

HttpResponse HttpServer::dispatch(const HttpRequest& request) const {
  auto path = routes_.find(request.path);
  if (path == routes_.end()) return {404, "application/json", http_error_body("no route " + request.path), {}, {}};
  auto handler = path->second.find(request.method);
  if (handler == path->second.end())
    return {405, "application/json", http_error_body(request.method + " is not allowed on " + request.path), {}, {}};
  try {
    return handler->second(request);
  } catch (const InputError& e) {
    return {400, "application/json", http_error_body(e.what()), {}, {}};
  } catch (const std::exception& e) {
    return {500, "application/json", http_error_body(e.what()), {}, {}};
  }
}

void HttpServer::serve_connection(int fd) {
  std::string buf;
  for (;;) {
    size_t header_end = std::string::npos;
    if (!read_until(fd, buf, limits_.max_header_bytes, limits_.idle_timeout_seconds, stopping_,
                    [&] { return (header_end = buf.find("\r\n\r\n")) != std::string::npos; })) {
      if (buf.size() > limits_.max_header_bytes) send_error(fd, 431, "request headers too large");
      return;
    }
    HttpRequestHead parsed = parse_request_head(std::string_view(buf).substr(0, header_end), limits_);
    if (parsed.error_status) return send_error(fd, parsed.error_status, parsed.error);
    HttpRequest& req = parsed.request;
    const size_t body_bytes = parsed.body_bytes;
    buf.erase(0, header_end + 4);
    if (!read_until(fd, buf, limits_.max_body_bytes + 1, limits_.idle_timeout_seconds, stopping_,
                    [&] { return buf.size() >= body_bytes; }))
      return;
    req.body = buf.substr(0, body_bytes);
    buf.erase(0, body_bytes);

    const bool keep_alive = parsed.keep_alive;
    HttpResponse res = dispatch(req);
    const std::string header = head(res, keep_alive && !res.stream);
    if (!send_all(fd, header.data(), header.size())) return;
    if (res.stream) {
      HttpStream stream(fd);
      res.stream(stream);
      return;
    }
    if (!send_all(fd, res.body.data(), res.body.size()) || !keep_alive || stopping_) return;
  }
}

}  // namespace gpulab::core
