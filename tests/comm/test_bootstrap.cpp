#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "common/free_port.h"
#include "core/error.h"

namespace gpulab::comm {
namespace {

using namespace std::chrono_literals;
using Env = std::map<std::string, std::string>;

JobEnv parse(const Env& env) {
  return job_from_env([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The message of the InputError that parsing `env` throws ("" if none).
std::string input_error(const Env& env) {
  try {
    parse(env);
  } catch (const core::InputError& e) {
    return e.what();
  }
  return "";
}

TEST(JobEnv, NoLauncherIsOneProcess) {
  const JobEnv j = parse({{"HOME", "/root"}});
  EXPECT_EQ(j.rank, 0);
  EXPECT_EQ(j.world, 1);
  EXPECT_EQ(j.local_rank, 0);
  EXPECT_EQ(j.launcher, "none");
  EXPECT_TRUE(j.master_addr.empty());
}

TEST(JobEnv, Torchrun) {
  const JobEnv j = parse({{"RANK", "5"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"},
                          {"MASTER_PORT", "29600"}});
  EXPECT_EQ(j.launcher, "torchrun");
  EXPECT_EQ(j.rank, 5);
  EXPECT_EQ(j.world, 16);
  EXPECT_EQ(j.local_rank, 1);
  EXPECT_EQ(j.master_addr, "node7");
  EXPECT_EQ(j.master_port, 29600);
}

TEST(JobEnv, TorchrunDefaults) {
  // LOCAL_RANK defaults to RANK; one node (LOCAL_WORLD_SIZE == WORLD_SIZE) needs no MASTER_ADDR.
  const JobEnv j = parse({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(j.local_rank, 3);
  EXPECT_EQ(j.master_addr, "127.0.0.1");
  EXPECT_EQ(j.master_port, 29500);
  // World size 1 needs no rendezvous at all.
  const JobEnv one = parse({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(one.world, 1);
  EXPECT_TRUE(one.master_addr.empty());
}

TEST(JobEnv, TorchrunAgentStoreHoldsMasterPort) {
  const Env env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  EXPECT_EQ(parse(env).master_port, 29501);
  Env own = env;
  own["GPULAB_MASTER_PORT"] = "31000";
  EXPECT_EQ(parse(own).master_port, 31000);
  own["GPULAB_MASTER_PORT"] = "x";
  EXPECT_NE(input_error(own).find("GPULAB_MASTER_PORT='x' is not a port number"), std::string::npos);
}

TEST(JobEnv, OpenMpi) {
  const JobEnv j = parse({{"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                          {"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(j.launcher, "openmpi");
  EXPECT_EQ(j.rank, 6);
  EXPECT_EQ(j.world, 8);
  EXPECT_EQ(j.local_rank, 2);
  EXPECT_EQ(j.master_addr, "10.0.0.1");
  EXPECT_EQ(j.master_port, 29500);
  const std::string e = input_error({{"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_NE(e.find("MASTER_ADDR is not set"), std::string::npos) << e;
}

TEST(JobEnv, Slurm) {
  const Env base = {{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"}, {"SLURM_JOB_ID", "123456"},
                    {"SLURM_STEP_NUM_TASKS", "16"}};
  Env multi = base;
  multi["SLURM_NNODES"] = "2";
  multi["MASTER_ADDR"] = "gpu01";
  const JobEnv j = parse(multi);
  EXPECT_EQ(j.launcher, "slurm");
  EXPECT_EQ(j.rank, 9);
  EXPECT_EQ(j.world, 16);
  EXPECT_EQ(j.local_rank, 1);
  EXPECT_EQ(j.master_addr, "gpu01");
  EXPECT_EQ(j.master_port, 20000 + 123456 % 40000);  // from the job id: the same on every rank
  multi.erase("MASTER_ADDR");
  const std::string e = input_error(multi);
  EXPECT_NE(e.find("scontrol show hostnames"), std::string::npos) << e;
  Env single = base;
  single["SLURM_NNODES"] = "1";
  EXPECT_EQ(parse(single).master_addr, "127.0.0.1");
  // The batch script itself (no srun step): one process, whatever the allocation.
  Env script = single;
  script.erase("SLURM_STEP_NUM_TASKS");
  script["SLURM_PROCID"] = "0";
  EXPECT_EQ(parse(script).launcher, "none");
  EXPECT_EQ(parse(script).world, 1);
  single["SLURM_STEP_NUM_TASKS"] = "8";
  EXPECT_NE(input_error(single).find("SLURM_STEP_NUM_TASKS=8 disagrees with SLURM_NTASKS=16"), std::string::npos);
}

TEST(JobEnv, TorchrunWinsOverTheAllocation) {
  // torchrun inside a Slurm allocation: the torchrun variables describe this process.
  const JobEnv j = parse({{"RANK", "2"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"MASTER_ADDR", "a"},
                          {"MASTER_PORT", "1234"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(j.launcher, "torchrun");
  EXPECT_EQ(j.rank, 2);
  EXPECT_EQ(j.world, 8);
}

TEST(JobEnv, MissingAndInconsistentValuesNameTheVariable) {
  const Env addr = {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "2000"}};
  auto with = [&](Env e) {
    e.insert(addr.begin(), addr.end());
    return e;
  };
  struct Case {
    Env env;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {with({{"RANK", "1"}}), "RANK is set but WORLD_SIZE is not"},
      {with({{"WORLD_SIZE", "2"}}), "WORLD_SIZE is set but RANK is not"},
      {with({{"OMPI_COMM_WORLD_SIZE", "2"}}), "OMPI_COMM_WORLD_RANK is not"},
      {with({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), "RANK=4 is outside WORLD_SIZE=4"},
      {with({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), "RANK=-1 is outside"},
      {with({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE=0: the world size must be at least 1"},
      {with({{"RANK", "one"}, {"WORLD_SIZE", "4"}}), "RANK='one' is not an integer"},
      {with({{"RANK", "1"}, {"WORLD_SIZE", "4x"}}), "WORLD_SIZE='4x' is not an integer"},
      {with({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "4"}}), "LOCAL_RANK=4 is outside"},
      {with({{"SLURM_PROCID", "20"}, {"SLURM_NTASKS", "16"}, {"SLURM_STEP_NUM_TASKS", "16"}}),
       "SLURM_PROCID=20 is outside SLURM_NTASKS=16"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "4"}}, "MASTER_ADDR is not set"},
  };
  for (const auto& c : cases) {
    const std::string e = input_error(c.env);
    EXPECT_NE(e.find(c.expect), std::string::npos) << "expected '" << c.expect << "', got '" << e << "'";
  }
}

TEST(JobEnv, BadPort) {
  for (const std::string port : {"0", "65536", "70000", "http", "-5", "29500 "}) {
    const std::string e = input_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", port}});
    EXPECT_NE(e.find("MASTER_PORT='" + port + "' is not a port number"), std::string::npos) << e;
  }
}

UniqueId random_id(uint64_t seed) {
  std::mt19937_64 rng(seed);
  UniqueId id;
  for (auto& c : id) c = char(rng());
  return id;
}

JobEnv loopback(int rank, int world, int port) {
  JobEnv j;
  j.rank = rank;
  j.world = world;
  j.master_addr = "127.0.0.1";
  j.master_port = port;
  return j;
}

TEST(Rendezvous, EveryRankGetsRankZerosId) {
  for (const int world : {2, 5}) {
    const int port = free_tcp_port();
    const UniqueId id = random_id(uint64_t(world) * 7919 + uint64_t(port));
    std::atomic<int> made{0};
    std::vector<UniqueId> got(static_cast<size_t>(world));
    for (auto& g : got) g.fill(char(0x5a));  // poisoned
    std::vector<std::thread> ranks;
    // Ranks other than 0 start first: they must retry until rank 0 listens.
    for (int r = world - 1; r >= 0; --r) {
      ranks.emplace_back([&, r] {
        got[size_t(r)] = rendezvous(loopback(r, world, port), 20s, [&] {
          ++made;
          return id;
        });
      });
      if (r == 1) std::this_thread::sleep_for(200ms);
    }
    for (auto& t : ranks) t.join();
    EXPECT_EQ(made.load(), 1) << "only rank 0 makes the id";
    for (int r = 0; r < world; ++r) EXPECT_EQ(got[size_t(r)], id) << "rank " << r << " of " << world;
  }
}

TEST(Rendezvous, WorldOfOneNeedsNoNetwork) {
  const UniqueId id = random_id(3);
  JobEnv j;  // no address, no port
  EXPECT_EQ(rendezvous(j, 1s, [&] { return id; }), id);
}

TEST(Rendezvous, NoRankZeroTimesOutNamingTheAddress) {
  const int port = free_tcp_port();  // nobody listens there
  const auto start = std::chrono::steady_clock::now();
  try {
    rendezvous(loopback(1, 2, port), 700ms, [] { return UniqueId{}; });
    FAIL() << "expected a timeout";
  } catch (const core::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("could not reach rank 0 at 127.0.0.1:" + std::to_string(port) + " within 0.7 s"), std::string::npos) << m;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(s, 0.6);
  EXPECT_LT(s, 5.0);
}

TEST(Rendezvous, MissingRanksAreNamedByRankZero) {
  const int port = free_tcp_port();
  std::thread one([&] { EXPECT_THROW(rendezvous(loopback(1, 4, port), 3s, [] { return UniqueId{}; }), core::Error); });
  try {
    rendezvous(loopback(0, 4, port), 1s, [] { return UniqueId{}; });
    ADD_FAILURE() << "expected a timeout";
  } catch (const core::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks 2, 3 did not connect to port " + std::to_string(port) + " within 1 s"), std::string::npos) << m;
  }
  one.join();
}

TEST(Rendezvous, PortInUseIsAnInputError) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  try {
    rendezvous(loopback(0, 2, port), 1s, [] { return UniqueId{}; });
    ADD_FAILURE() << "expected an error";
  } catch (const core::InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot listen on MASTER_PORT=" + std::to_string(port)), std::string::npos) << m;
  }
  ::close(fd);
  JobEnv bad = loopback(1, 2, 70000);
  EXPECT_THROW(rendezvous(bad, 1s, [] { return UniqueId{}; }), core::InputError);
}

// Something else that connects to rank 0's port first and says nothing is dropped after the
// hello timeout (5 s): the rank queued behind it still gets the id, well before the rendezvous's.
TEST(Rendezvous, ASilentConnectionDoesNotHoldUpTheRanks) {
  const int port = free_tcp_port();
  const UniqueId id = random_id(11);
  UniqueId got{};
  const auto start = std::chrono::steady_clock::now();
  std::thread zero([&] { got = rendezvous(loopback(0, 2, port), 60s, [&] { return id; }); });
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  for (int tries = 0; ::connect(silent, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && tries < 100; ++tries)
    std::this_thread::sleep_for(20ms);  // until rank 0 listens
  std::this_thread::sleep_for(100ms);  // rank 0 now waits on the silent connection
  EXPECT_EQ(rendezvous(loopback(1, 2, port), 60s, [] { return UniqueId{}; }), id);
  zero.join();
  ::close(silent);
  EXPECT_EQ(got, id);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
}

TEST(Rendezvous, DisagreeingWorldSizesFailOnBothSides) {
  const int port = free_tcp_port();
  std::string client;
  std::thread one([&] {
    try {
      rendezvous(loopback(1, 3, port), 5s, [] { return UniqueId{}; });
    } catch (const core::InputError& e) {
      client = e.what();
    }
  });
  try {
    rendezvous(loopback(0, 2, port), 5s, [] { return UniqueId{}; });
    ADD_FAILURE() << "expected an error";
  } catch (const core::InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 has a world size of 3 but rank 0 has 2"), std::string::npos) << m;
  }
  one.join();
  EXPECT_NE(client.find("every rank needs the same WORLD_SIZE"), std::string::npos) << client;
}

}  // namespace
}  // namespace gpulab::comm
