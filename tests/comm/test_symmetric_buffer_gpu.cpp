// All-reduces over NCCL symmetric memory (SymmetricBuffer) give exactly the sums they give over
// plain buffers: integer-valued inputs make every order of summation exact, so each element of
// every rank's result must equal the host's sum. On every visible GPU (and one), through a
// blocking communicator (as the LLM engine and bench nccl use), out of place and in place,
// 8 B .. 4 MiB, and replayed from a captured CUDA graph with new inputs each time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "comm/symmetric_buffer.h"
#include "common/gpu.h"
#include "core/error.h"
#include "core/memory.h"

namespace gpulab::comm {
namespace {

// Element counts: 8 B up, odd ones that are not whole multiples of 4 elements, up to 4 MiB.
constexpr size_t kCounts[] = {2, 3, 7, 13, 1001, 4099, 65537, size_t(1) << 20};
constexpr size_t kMaxCount = size_t(1) << 20;

std::vector<float> integer_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(int(rng() % 2001) - 1000);
  return v;
}

// Rank r's input for case `tag`; sum_of is the sum over the ranks.
std::vector<float> input(int rank, size_t n, uint64_t tag) { return integer_values(n, tag * 1000 + uint64_t(rank)); }
std::vector<float> sum_of(int world, size_t n, uint64_t tag) {
  std::vector<float> s(n, 0.f);
  for (int r = 0; r < world; ++r) {
    const std::vector<float> v = input(r, n, tag);
    for (size_t i = 0; i < n; ++i) s[i] += v[i];
  }
  return s;
}

void put(float* dst, const std::vector<float>& v, cudaStream_t s) {
  GPULAB_CHECK(cudaMemcpyAsync(dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice, s));
  GPULAB_CHECK(cudaStreamSynchronize(s));  // pageable: the copy must land before v goes
}

void poison(float* p, size_t n, cudaStream_t s) { GPULAB_CHECK(cudaMemsetAsync(p, 0xff, n * 4, s)); }  // NaN

// Every element: the number that differ, and the first.
void expect_sums(const float* got_device, const std::vector<float>& want, cudaStream_t s, const std::string& what) {
  std::vector<float> got(want.size());
  GPULAB_CHECK(cudaMemcpyAsync(got.data(), got_device, got.size() * 4, cudaMemcpyDeviceToHost, s));
  GPULAB_CHECK(cudaStreamSynchronize(s));
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i]) && wrong++ == 0) first = i;
  EXPECT_EQ(wrong, 0u) << what << ": " << wrong << " of " << want.size() << " elements wrong, first " << first
                       << " is " << got[first] << " for " << want[first];
}

// Where NCCL must give a window: several GPUs of one process that reach each other. One rank's
// outcome is printed (NCCL decides it).
void expect_window(bool symmetric, int world) {
  std::printf("world %d: %s\n", world, symmetric ? "symmetric window" : "plain memory (no window)");
  if (world > 1 && gpus_reach_each_other(world)) {
    EXPECT_TRUE(symmetric) << "world " << world;
  }
}

// One communicator per GPU 0 .. world-1 from ncclCommInitAll (blocking), freed at the end.
class BlockingComms {
 public:
  explicit BlockingComms(int world) : comms_(size_t(world)) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // these machines must not create multicast objects
    std::vector<int> devices(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) devices[size_t(r)] = r;
    GPULAB_CHECK(ncclCommInitAll(comms_.data(), world, devices.data()));
  }
  ~BlockingComms() {
    for (ncclComm_t c : comms_) GPULAB_CHECK_NOTHROW(ncclCommDestroy(c));
  }
  ncclComm_t operator[](int rank) const { return comms_[size_t(rank)]; }

 private:
  std::vector<ncclComm_t> comms_;
};

void sums_over_blocking_comms(int world) {
  SCOPED_TRACE("world " + std::to_string(world));
  BlockingComms comms(world);
  run_on_gpus(world, [&](int rank) {
    core::Stream s;
    SymmetricBuffer<float> send(comms[rank], kMaxCount), recv(comms[rank], kMaxCount);
    EXPECT_EQ(send.symmetric(), recv.symmetric());
    if (rank == 0) expect_window(send.symmetric(), world);
    core::DeviceBuffer<float> plain_send(kMaxCount), plain_recv(kMaxCount);
    for (const size_t n : kCounts) {
      const std::string what = "rank " + std::to_string(rank) + ", " + std::to_string(n) + " floats";
      const uint64_t tag = n;
      const std::vector<float> want = sum_of(world, n, tag);
      for (const bool symmetric : {false, true}) {
        float* in = symmetric ? send.get() : plain_send.get();
        float* out = symmetric ? recv.get() : plain_recv.get();
        const std::string how = what + (symmetric ? ", symmetric" : ", plain");
        put(in, input(rank, n, tag), s);
        poison(out, n, s);
        GPULAB_CHECK(ncclAllReduce(in, out, n, ncclFloat, ncclSum, comms[rank], s.get()));
        expect_sums(out, want, s.get(), how + ", out of place");
        GPULAB_CHECK(ncclAllReduce(in, in, n, ncclFloat, ncclSum, comms[rank], s.get()));  // the engine's residual
        expect_sums(in, want, s.get(), how + ", in place");
      }
    }
  });
}

TEST(SymmetricBuffer, AllReduceEqualsPlainBuffersOnEveryGpu) {
  GPULAB_REQUIRE_GPU();
  sums_over_blocking_comms(visible_gpus());
}

TEST(SymmetricBuffer, AllReduceEqualsPlainBuffersOnOneGpu) {
  GPULAB_REQUIRE_GPU();
  sums_over_blocking_comms(1);
}

// The decode step's way: the in-place all-reduce captured once, replayed with new inputs that are
// copied in before each launch.
TEST(SymmetricBuffer, AllReduceReplaysFromACapturedGraph) {
  GPULAB_REQUIRE_GPU();
  const int world = visible_gpus();
  BlockingComms comms(world);
  run_on_gpus(world, [&](int rank) {
    core::Stream s;
    for (const size_t n : {size_t(4096), size_t(4099), size_t(1) << 17}) {  // 16 KB (7B batch 1), odd, 512 KB
      SymmetricBuffer<float> x(comms[rank], n);
      const std::string what = "rank " + std::to_string(rank) + ", " + std::to_string(n) + " floats";
      cudaGraph_t graph = nullptr;
      GPULAB_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
      GPULAB_CHECK(ncclAllReduce(x.get(), x.get(), n, ncclFloat, ncclSum, comms[rank], s.get()));
      GPULAB_CHECK(cudaStreamEndCapture(s.get(), &graph));
      cudaGraphExec_t exec = nullptr;
      GPULAB_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (uint64_t replay = 0; replay < 4; ++replay) {
        const uint64_t tag = 7000 + n * 10 + replay;
        put(x.get(), input(rank, n, tag), s);
        GPULAB_CHECK(cudaGraphLaunch(exec, s.get()));
        expect_sums(x.get(), sum_of(world, n, tag), s.get(), what + ", replay " + std::to_string(replay));
      }
      GPULAB_CHECK(cudaGraphExecDestroy(exec));
      GPULAB_CHECK(cudaGraphDestroy(graph));
    }
  });
}

// Without a communicator: a plain device buffer, no NCCL call.
TEST(SymmetricBuffer, WithoutACommunicatorIsAPlainBuffer) {
  GPULAB_REQUIRE_GPU();
  SymmetricBuffer<float> b(nullptr, 1000);
  EXPECT_FALSE(b.symmetric());
  EXPECT_EQ(b.size(), 1000u);
  EXPECT_EQ(b.bytes(), 4000u);
  cudaPointerAttributes at{};
  GPULAB_CHECK(cudaPointerGetAttributes(&at, b.get()));
  EXPECT_EQ(at.type, cudaMemoryTypeDevice);
  SymmetricBuffer<float> moved = std::move(b);
  EXPECT_EQ(b.get(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_NE(moved.get(), nullptr);
}

}  // namespace
}  // namespace gpulab::comm
