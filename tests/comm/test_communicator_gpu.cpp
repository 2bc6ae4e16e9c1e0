#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "common/free_port.h"
#include "common/gpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory.h"

namespace gpulab::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

template <class T>
std::vector<T> download(const core::DeviceBuffer<T>& b) {
  std::vector<T> h(b.size());
  GPULAB_CHECK(cudaMemcpy(h.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

template <class T>
core::DeviceBuffer<T> upload(const std::vector<T>& h) {
  core::DeviceBuffer<T> b(h.size());
  GPULAB_CHECK(cudaMemcpy(b.get(), h.data(), b.bytes(), cudaMemcpyHostToDevice));
  // A pageable upload may still be landing when cudaMemcpy returns, and the collectives run on a
  // non-blocking stream that does not wait for it: without this the poison could overwrite results.
  GPULAB_CHECK(cudaDeviceSynchronize());
  return b;
}

core::DeviceBuffer<float> poisoned(size_t n) {
  return upload(std::vector<float>(n, std::nanf("")));
}

// Small integers: every sum over ranks is exact in fp32, whatever order NCCL adds in.
std::vector<float> integer_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(int(rng() % 2001) - 1000);
  return v;
}

TEST(Communicator, WorldOfOneIsTheIdentity) {
  GPULAB_REQUIRE_GPU();
  Communicator comm(rendezvous(JobEnv{}, 1s, make_unique_id), 0, 1, 0);
  core::Stream s;
  const size_t n = 100003;  // not a multiple of anything NCCL chunks by
  const std::vector<float> in = integer_values(n, 1);
  const auto send = upload(in);
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    auto out = poisoned(n);
    comm.all_reduce(send.get(), out.get(), n, core::DType::f32, op, s);
    comm.wait(s.get());
    const std::vector<float> got = download(out);
    size_t wrong = 0, first = n;
    for (size_t i = 0; i < n; ++i)
      if (!(got[i] == in[i]) && wrong++ == 0) first = i;
    EXPECT_EQ(wrong, 0u) << (op == ReduceOp::sum ? "sum" : "avg") << ": first wrong element " << first << " is "
                         << (first < n ? got[first] : 0.f) << " for " << (first < n ? in[first] : 0.f);
  }
  // In place, in bf16: the bits come back unchanged.
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = core::float_to_bf16_bits(in[i] * 0.37f);
  auto b16 = upload(bits);
  comm.all_reduce(b16.get(), b16.get(), n, core::DType::bf16, ReduceOp::avg, s);
  auto bc = poisoned(n), ag = poisoned(n);
  comm.broadcast(send.get(), bc.get(), n, core::DType::f32, 0, s);
  comm.all_gather(send.get(), ag.get(), n, core::DType::f32, s);
  comm.wait(s.get());
  EXPECT_EQ(download(b16), bits);
  EXPECT_EQ(download(bc), in);
  EXPECT_EQ(download(ag), in);
  comm.check();
  EXPECT_FALSE(comm.aborted());
}

// Each GPU a rank, the id passed through the TCP rendezvous as separate processes would.
TEST(Communicator, CollectivesAcrossEveryGpu) {
  GPULAB_REQUIRE_GPU();
  const int world = visible_gpus();
  if (world < 2) GTEST_SKIP() << "needs 2 GPUs, " << world << " visible";
  const int port = free_tcp_port();
  const size_t n = 1 << 20 | 77;
  std::vector<std::vector<float>> in(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) in[size_t(r)] = integer_values(n, 100 + uint64_t(r));
  std::vector<float> sum(n, 0.f);
  for (const auto& v : in)
    for (size_t i = 0; i < n; ++i) sum[i] += v[i];
  run_on_gpus(world, [&](int rank) {
    JobEnv job;
    job.rank = rank, job.world = world, job.master_addr = "127.0.0.1", job.master_port = port;
    Communicator comm(rendezvous(job, 60s, make_unique_id), rank, world, rank);
    core::Stream s;
    const auto send = upload(in[size_t(rank)]);
    auto red = poisoned(n), avg = poisoned(n), bc = poisoned(n), ag = poisoned(n * size_t(world));
    comm.all_reduce(send.get(), red.get(), n, core::DType::f32, ReduceOp::sum, s);
    comm.all_reduce(send.get(), avg.get(), n, core::DType::f32, ReduceOp::avg, s);
    comm.broadcast(send.get(), bc.get(), n, core::DType::f32, world - 1, s);
    comm.all_gather(send.get(), ag.get(), n, core::DType::f32, s);
    comm.wait(s.get());
    EXPECT_EQ(download(red), sum) << "rank " << rank;
    const std::vector<float> a = download(avg);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i)
      bad += !(std::fabs(a[i] - sum[i] / float(world)) <= 1e-6f * std::fabs(sum[i]) + 1e-6f);
    EXPECT_EQ(bad, 0u) << "rank " << rank << ": averaged elements off";
    EXPECT_EQ(download(bc), in[size_t(world - 1)]) << "rank " << rank;
    const std::vector<float> g = download(ag);
    for (int r = 0; r < world; ++r)
      EXPECT_TRUE(std::equal(in[size_t(r)].begin(), in[size_t(r)].end(), g.begin() + ptrdiff_t(size_t(r) * n)))
          << "rank " << rank << ": slot " << r << " of the all-gather";
  });
}

TEST(Communicator, APeerThatNeverJoinsEndsInitWithinTheTimeout) {
  GPULAB_REQUIRE_GPU();
  const auto start = Clock::now();
  try {
    Communicator comm(make_unique_id(), 0, 2, 0, CommOptions{2s});
    FAIL() << "init of a world of 2 with one rank cannot finish";
  } catch (const core::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 0 of 2: no progress while joining the communicator for 2 s"), std::string::npos) << m;
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(s, 1.9);
  EXPECT_LT(s, 30.0);
}

TEST(Communicator, AFailedSiblingThreadAbortsTheOthers) {
  GPULAB_REQUIRE_GPU();
  const UniqueId id = make_unique_id();
  const auto start = Clock::now();
  try {
    run_ranks(2, [&](int rank) {
      if (rank == 1) {
        std::this_thread::sleep_for(300ms);
        throw core::InputError("rank 1 broke before joining");
      }
      GPULAB_CHECK(cudaSetDevice(0));
      Communicator comm(id, 0, 2, 0, CommOptions{120s});  // would wait 2 minutes without the cancellation
    });
    FAIL() << "expected rank 1's error";
  } catch (const core::InputError& e) {
    EXPECT_STREQ(e.what(), "rank 1 broke before joining");
  }
  EXPECT_LT(Clock::now() - start, 30s);
}

// Rank 1 takes part in a first all-reduce, then hangs (never enters the second): rank 0's wait
// must end with the watchdog's error. A peer that never joined any collective is another case:
// NCCL 2.28 connects ranks lazily at their first collective (NCCL_RUNTIME_CONNECT), and that
// handshake can block rank 0 outside a collective (the first version of this test hung past
// ctest's 60 s that way, or in the abort). The hung rank ends only when its group is cancelled,
// which rank 0's watchdog does before it aborts: NCCL frees a process's shared resources only
// when its last communicator is aborted or destroyed.
TEST(Communicator, AHungPeerEndsTheCollectiveWithAClearError) {
  GPULAB_REQUIRE_GPU();
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 GPUs, " << visible_gpus() << " visible";
  const UniqueId id = make_unique_id();
  std::atomic<bool> rank1_saw_cancel{false};
  const auto start = Clock::now();
  double waited = 0;
  try {
    run_on_gpus(2, [&](int rank) {
      Communicator comm(id, rank, 2, rank, CommOptions{10s});  // long enough for a cold init
      core::Stream s;
      auto x = upload(integer_values(1 << 20, 7 + uint64_t(rank)));
      comm.all_reduce(x.get(), x.get(), x.size(), core::DType::f32, ReduceOp::sum, s);
      comm.wait(s.get());
      if (rank == 1) {
        const auto deadline = Clock::now() + 40s;
        while (!cancelled() && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
        rank1_saw_cancel = cancelled();
        return;
      }
      const auto t0 = Clock::now();
      comm.all_reduce(x.get(), x.get(), x.size(), core::DType::f32, ReduceOp::sum, s);
      try {
        comm.wait(s.get());
      } catch (...) {
        waited = std::chrono::duration<double>(Clock::now() - t0).count();
        EXPECT_TRUE(comm.aborted());
        throw;
      }
    });
    FAIL() << "the second all-reduce cannot finish without rank 1";
  } catch (const core::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 0 of 2: no progress while waiting for collectives for 10 s"), std::string::npos) << m;
  }
  EXPECT_GE(waited, 9.9);
  EXPECT_TRUE(rank1_saw_cancel) << "rank 0's watchdog cancels its sibling threads before it aborts";
  EXPECT_LT(Clock::now() - start, 45s) << "ctest ends this test at 60 s";
}

}  // namespace
}  // namespace gpulab::comm
