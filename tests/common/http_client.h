// A minimal blocking HTTP/1.1 client for tests of `gpulab serve` on loopback.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

namespace gpulab::testing {

struct HttpReply {
  int status = 0;
  std::string headers;
  std::string body;
};

// Connects to 127.0.0.1:port; -1 on failure.
inline int http_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// `headers`: extra header lines, each ending in \r\n.
inline void http_send(int fd, const std::string& method, const std::string& path, const std::string& body,
                      const std::string& headers = "") {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + headers;
  if (!body.empty() || method == "POST") req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
    throw std::runtime_error("send failed");
}

// Reads the whole reply (the server closes the connection: Connection: close).
inline HttpReply http_read(int fd) {
  std::string raw;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, static_cast<size_t>(n));
  HttpReply r;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.headers = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  return r;
}

inline HttpReply http_request(int port, const std::string& method, const std::string& path, const std::string& body = "",
                              const std::string& headers = "") {
  const int fd = http_connect(port);
  if (fd < 0) throw std::runtime_error("cannot connect");
  http_send(fd, method, path, body, headers);
  HttpReply r = http_read(fd);
  ::close(fd);
  return r;
}

}  // namespace gpulab::testing
