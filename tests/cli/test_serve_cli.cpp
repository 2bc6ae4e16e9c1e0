// `gpulab serve` as a process: where it listens, the API key from the flag or the environment,
// and what its log holds (no prompt text unless --log-prompts).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/http_client.h"

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// `gpulab serve --model tiny --port P ARGS...` with `env` added, its stderr in a file.
class ServeProcess {
 public:
  ServeProcess(std::vector<std::string> args, const std::vector<std::string>& env = {}) : port_(free_port()) {
    log_ = ::testing::TempDir() + "serve_" + std::to_string(::getpid()) + "_" + std::to_string(port_) + ".log";
    const std::string model = std::string(GPULAB_TEST_DATA) + "/llama_tiny";
    args.insert(args.begin(), {GPULAB_EXE, "serve", "--model", model, "--port", std::to_string(port_)});
    pid_ = ::fork();
    if (pid_ == 0) {
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::freopen(log_.c_str(), "w", stderr);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(GPULAB_EXE, argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 500 && !up_; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      try {
        up_ = gpulab::testing::http_request(port_, "GET", "/health").status == 200;
      } catch (const std::exception&) {
      }
    }
  }
  ~ServeProcess() {
    if (pid_ > 0) stop();
  }
  bool up() const { return up_; }
  int port() const { return port_; }
  // SIGTERM, then the exit status and everything it logged.
  int stop() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  int port_;
  pid_t pid_ = -1;
  bool up_ = false;
  std::string log_;
};

const std::string kPrompt = R"({"prompt": "zebra quokka marmalade", "max_tokens": 2, "temperature": 0})";

}  // namespace

TEST(ServeCli, ListensOnLoopbackByDefault) {
  ServeProcess s({});
  ASSERT_TRUE(s.up());
  // /proc/net/tcp lists listening sockets (state 0A) as hex IPv4:port; 0100007F is 127.0.0.1.
  std::ifstream tcp("/proc/net/tcp");
  std::string line, found;
  char port_hex[8];
  std::snprintf(port_hex, sizeof port_hex, ":%04X", s.port());
  while (std::getline(tcp, line))
    if (line.find(std::string(port_hex) + " ") != std::string::npos && line.find(" 0A ") != std::string::npos) found = line;
  ASSERT_FALSE(found.empty()) << "no listening socket on port " << s.port();
  EXPECT_NE(found.find("0100007F" + std::string(port_hex)), std::string::npos) << found;
  EXPECT_EQ(s.stop(), 0);
  EXPECT_NE(s.log().find("http://127.0.0.1:"), std::string::npos) << s.log();
}

TEST(ServeCli, ApiKeyFromFlagOrEnvironment) {
  for (const bool from_env : {false, true}) {
    ServeProcess s(from_env ? std::vector<std::string>{} : std::vector<std::string>{"--api-key", "k-123"},
                   from_env ? std::vector<std::string>{"GPULAB_API_KEY=k-123"} : std::vector<std::string>{});
    ASSERT_TRUE(s.up());  // /health needs no key
    EXPECT_EQ(gpulab::testing::http_request(s.port(), "POST", "/v1/completions", kPrompt).status, 401);
    EXPECT_EQ(gpulab::testing::http_request(s.port(), "POST", "/v1/completions", kPrompt, "Authorization: Bearer k-12\r\n").status, 401);
    EXPECT_EQ(gpulab::testing::http_request(s.port(), "POST", "/v1/completions", kPrompt, "Authorization: Bearer k-123\r\n").status, 200);
    EXPECT_EQ(s.stop(), 0);
    EXPECT_EQ(s.log().find("k-123"), std::string::npos) << "the key must not be logged:\n" << s.log();
  }
}

TEST(ServeCli, PromptTextIsLoggedOnlyWithLogPrompts) {
  for (const bool log_prompts : {false, true}) {
    // Without the flag, at debug level: the request line is there, its prompt is not.
    ServeProcess s(log_prompts ? std::vector<std::string>{"--log-prompts"} : std::vector<std::string>{},
                   {"GPULAB_LOG_LEVEL=debug"});
    ASSERT_TRUE(s.up());
    const auto r = gpulab::testing::http_request(s.port(), "POST", "/v1/completions", kPrompt);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(s.stop(), 0);
    const std::string log = s.log();
    EXPECT_NE(log.find("cmpl-"), std::string::npos) << "the request is logged (counts and times):\n" << log;
    EXPECT_EQ(log.find("quokka") != std::string::npos, log_prompts) << log;
  }
}
