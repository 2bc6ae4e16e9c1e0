#include "trace/collect.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "trace/chrome_trace.h"

namespace gpulab::trace {

namespace fs = std::filesystem;

fs::path find_inject_library() {
  if (const char* env = std::getenv("GPULAB_TRACE_LIB")) {
    if (!fs::exists(env)) throw core::InputError(std::string("GPULAB_TRACE_LIB=") + env + ": no such file");
    return env;
  }
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path() / "libgpulab_trace.so");
    candidates.push_back(exe.parent_path().parent_path() / "lib" / "libgpulab_trace.so");
  }
  candidates.push_back(GPULAB_TRACE_INJECT_PATH);  // the build tree
  for (const auto& c : candidates)
    if (fs::exists(c)) return fs::absolute(c);
  throw core::Error("cannot find libgpulab_trace.so (looked beside the gpulab executable, in ../lib and in " +
                    std::string(GPULAB_TRACE_INJECT_PATH) + "); set GPULAB_TRACE_LIB to its path");
}

TracedRun run_traced(const std::vector<std::string>& command, const fs::path& out_dir, double duration_s,
                     bool nvtx) {
  if (command.empty()) throw core::InputError("diagnose: give the program to run after --, or --trace FILE");
  const fs::path lib = find_inject_library();
  fs::create_directories(out_dir);
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("process-", 0) == 0 && e.path().extension() == ".json") fs::remove(e.path());
  }

  // The child inherits a terminal's Ctrl-C itself; gpulab waits for it to flush and exit.
  struct sigaction ignore {}, old_int {}, old_term {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGTERM, &ignore, &old_term);
  const pid_t pid = fork();
  if (pid < 0) throw core::Error(std::string("diagnose: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    setenv("CUDA_INJECTION64_PATH", lib.c_str(), 1);
    // NVTX ranges, forwarded to CUPTI (inject.cpp). Only when asked: with it, gpulab train ran
    // 21 % slower under diagnose on the H200 (0.9 % without), the host late with every launch.
    if (nvtx) setenv("NVTX_INJECTION64_PATH", lib.c_str(), 1);
    setenv(kEnvOutDir, fs::absolute(out_dir).c_str(), 1);
    if (duration_s > 0) setenv(kEnvDuration, std::to_string(duration_s).c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "gpulab: diagnose: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);

  TracedRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("process-", 0) == 0 && e.path().extension() == ".json") run.trace_files.push_back(e.path());
  }
  std::sort(run.trace_files.begin(), run.trace_files.end());
  return run;
}

Trace merge_traces(const std::vector<fs::path>& files) {
  Trace out;
  int64_t index = 0;
  for (const auto& f : files) {
    Trace t = read_chrome_trace(f);
    // Correlation ids restart in each process; the process index in the high bits keeps them apart.
    const int64_t offset = index++ << 40;
    const auto shift = [&](int64_t& c) { if (c != 0) c += offset; };
    for (auto& k : t.kernels) shift(k.correlation), out.kernels.push_back(std::move(k));
    for (auto& m : t.memcpys) shift(m.correlation), out.memcpys.push_back(m);
    for (auto& m : t.memsets) shift(m.correlation), out.memsets.push_back(m);
    for (auto& c : t.api_calls) shift(c.correlation), out.api_calls.push_back(std::move(c));
    out.um_events.insert(out.um_events.end(), t.um_events.begin(), t.um_events.end());
    out.samples.insert(out.samples.end(), t.samples.begin(), t.samples.end());
    out.ranges.insert(out.ranges.end(), t.ranges.begin(), t.ranges.end());
    for (auto& [id, d] : t.devices) out.devices[id] = d;
    out.dropped_records += t.dropped_records;
    out.um_counters_enabled = out.um_counters_enabled || t.um_counters_enabled;
    for (const auto& n : t.notes) out.notes.push_back(f.filename().string() + ": " + n);
    out.source += (out.source.empty() ? "" : " + ") + t.source;
  }
  return out;
}

}  // namespace gpulab::trace
