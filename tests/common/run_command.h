// Runs a command line through the shell and captures its output and exit status.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>

extern char** environ;

namespace gpulab::testing {

struct CommandResult {
  int exit_code;
  std::string out;  // stdout and stderr together
};

// The shell gets this process's stdin, one pipe for stdout and stderr, and no other descriptor,
// as Python's subprocess gives a child. popen passed on every descriptor not marked close-on-exec,
// compute-sanitizer's own among them in a test that runs under it. There this binary's `gpulab
// train` children stalled at their first batch; started this way, they finish (docs/reliability.md,
// sessions 32-36).
inline CommandResult run_command(const std::string& command) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return {-1, std::string("run_command: pipe: ") + std::strerror(errno)};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  pid_t pid = 0;
  const int spawn_error = posix_spawn(&pid, "/bin/sh", &actions, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawn_error != 0) {
    close(pipe_fds[0]);
    return {-1, std::string("run_command: posix_spawn: ") + std::strerror(spawn_error)};
  }
  std::string out;
  std::array<char, 4096> buf;
  for (ssize_t n; (n = read(pipe_fds[0], buf.data(), buf.size())) != 0;) {
    if (n > 0) out.append(buf.data(), size_t(n));
    else if (errno != EINTR) break;
  }
  close(pipe_fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace gpulab::testing
