// Data parallelism as separate processes configured by torchrun-style variables, the way a
// multi-node job runs: the TCP rendezvous, rank-0-only output, and a rank killed mid-training
// ending the job with the watchdog's error instead of a hang.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/free_port.h"
#include "common/gpu.h"
#include "common/run_command.h"

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Rank `rank` of 2 as a torchrun worker would start it, training a tiny model with `args`. Through
// env(1): `timeout` runs a program, and plain VAR=value words are no program; env also execs the
// binary in its own pid, so `$!` is the rank that the kill below ends.
std::string rank_line(int rank, int port, const std::string& args) {
  return "env RANK=" + std::to_string(rank) + " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(rank) +
         " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " + GPULAB_EXE +
         " train --synthetic --depth 18 --classes 10 --image-size 32 --batch 8 " + args;
}

// The same, bounded by `timeout` (exit 124 on a hang), output and exit status into dir/out<r>, dir/rc<r>.
std::string recorded(int rank, int port, const fs::path& dir, const std::string& args) {
  const std::string r = std::to_string(rank);
  return "(timeout 180 " + rank_line(rank, port, args) + " > " + (dir / ("out" + r)).string() + " 2>&1; echo $? > " +
         (dir / ("rc" + r)).string() + ")";
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("gpulab_dp_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST(MultiProcessGpu, TwoRanksTrainAndOnlyRankZeroReports) {
  GPULAB_REQUIRE_GPU();
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 GPUs, " << visible_gpus() << " visible";
  TempDir t;
  const int port = free_tcp_port();
  auto args = [&](int r) { return "--steps 6 --json " + (t.path / ("r" + std::to_string(r) + ".json")).string(); };
  // Rank 1 first: it must wait for rank 0 to listen.
  gpulab::testing::run_command(recorded(1, port, t.path, args(1)) + " & sleep 1; " + recorded(0, port, t.path, args(0)) +
                               "; wait");
  EXPECT_EQ(read_text(t.path / "rc0"), "0\n") << read_text(t.path / "out0");
  EXPECT_EQ(read_text(t.path / "rc1"), "0\n") << read_text(t.path / "out1");
  const std::string out0 = read_text(t.path / "out0");
  EXPECT_NE(out0.find("data parallel over 2 GPUs"), std::string::npos) << out0;
  EXPECT_EQ(read_text(t.path / "out1"), "") << "rank 1 prints nothing";
  EXPECT_TRUE(fs::exists(t.path / "r0.json"));
  EXPECT_FALSE(fs::exists(t.path / "r1.json")) << "results come from rank 0 only";
}

TEST(MultiProcessGpu, AKilledRankEndsTheOtherWithAClearErrorWithinTheTimeout) {
  GPULAB_REQUIRE_GPU();
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 GPUs, " << visible_gpus() << " visible";
  TempDir t;
  const int port = free_tcp_port();
  const std::string args = "--steps 1000000 --comm-timeout 10";
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 is killed (SIGKILL: no cleanup) after 15 s, well into training; rank 0 must not hang.
  gpulab::testing::run_command(recorded(0, port, t.path, args) + " & " + rank_line(1, port, args) +
                               " > /dev/null 2>&1 & P1=$!; sleep 15; kill -9 $P1; wait");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string rc = read_text(t.path / "rc0"), out = read_text(t.path / "out0");
  EXPECT_NE(rc, "0\n") << out;
  EXPECT_NE(rc, "124\n") << "rank 0 hung until `timeout` killed it: " << out;
  EXPECT_NE(out.find("rank 0 of 2"), std::string::npos) << out;
  EXPECT_LT(seconds, 15 + 10 + 60) << out;
}
