// gpulab bench nccl: all-reduce, all-gather, reduce-scatter and broadcast over every visible GPU
// (one thread per GPU, one communicator per GPU from ncclCommInitAll), sizes as nccl-tests counts
// them, algbw and busbw, and #wrong from exact integer inputs checked once per size. The
// all-reduce runs twice: over plain buffers, and over NCCL symmetric memory (all_reduce_symmetric_*
// rows, comm/symmetric_buffer.h), where NCCL picks its low-latency symmetric kernels.
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "bench/collective_data.h"
#include "bench/suite.h"
#include "bench/timing.h"
#include "comm/symmetric_buffer.h"
#include "core/memory.h"

namespace gpulab::bench {

namespace {

void enqueue(Collective c, const float* send, float* recv, size_t send_count, int ranks, ncclComm_t comm,
             cudaStream_t s) {
  switch (c) {
    case Collective::all_reduce: GPULAB_CHECK(ncclAllReduce(send, recv, send_count, ncclFloat, ncclSum, comm, s)); break;
    case Collective::all_gather: GPULAB_CHECK(ncclAllGather(send, recv, send_count, ncclFloat, comm, s)); break;
    case Collective::reduce_scatter:
      GPULAB_CHECK(ncclReduceScatter(send, recv, send_count / ranks, ncclFloat, ncclSum, comm, s));
      break;
    case Collective::broadcast: GPULAB_CHECK(ncclBroadcast(send, recv, send_count, ncclFloat, 0, comm, s)); break;
  }
}

// One row family: a collective over plain buffers, or the all-reduce over symmetric memory.
struct Case {
  Collective c;
  bool symmetric;
};

// The symmetric rows stop here, so their buffers stay small beside the plain ones.
constexpr size_t kSymmetricMaxBytes = size_t(512) << 20;

struct Measured {
  std::vector<double> ms;  // rank 0's per-operation times, one per sample
  uint64_t wrong = 0;      // summed over ranks
};

}  // namespace

void run_nccl_suite(Context& ctx) {
  int ranks = 0;
  GPULAB_CHECK(cudaGetDeviceCount(&ranks));
  size_t min_free = SIZE_MAX;
  for (int d = 0; d < ranks; ++d) {
    GPULAB_CHECK(cudaSetDevice(d));
    size_t free_bytes = 0, total = 0;
    GPULAB_CHECK(cudaMemGetInfo(&free_bytes, &total));
    min_free = std::min(min_free, free_bytes);
  }
  GPULAB_CHECK(cudaSetDevice(ctx.options().device));
  // Each rank holds at most twice the size (send + receive); keep that under a quarter of free
  // memory (the symmetric rows' buffers add at most twice kSymmetricMaxBytes).
  const size_t cap = min_free / 8;
  std::vector<size_t> sizes;
  if (ctx.quick())
    sizes = {size_t(8) << 10, size_t(1) << 20, size_t(64) << 20, size_t(512) << 20};
  else
    for (size_t s = 8; s <= (size_t(8) << 30); s *= 8) sizes.push_back(s);
  std::erase_if(sizes, [&](size_t s) { return s > cap; });
  const int samples = ctx.quick() ? 5 : 10;

  // NVLink SHARP multicast stays off (unless the user set it): these machines must not create
  // multicast objects.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<ncclComm_t> comms(ranks);
  std::vector<int> devs(ranks);
  for (int d = 0; d < ranks; ++d) devs[d] = d;
  GPULAB_CHECK(ncclCommInitAll(comms.data(), ranks, devs.data()));

  std::vector<Case> cases;
  for (const Collective c : kCollectives) {
    cases.push_back({c, false});
    if (c == Collective::all_reduce) cases.push_back({c, true});
  }
  size_t symmetric_largest = 0;
  for (size_t s : sizes)
    if (s <= kSymmetricMaxBytes) symmetric_largest = s;
  std::vector<std::vector<Measured>> results(cases.size(), std::vector<Measured>(sizes.size()));
  std::mutex mutex;
  std::exception_ptr failure;
  bool symmetric = true;  // every rank's buffers got their window
  auto rank_main = [&](int rank) {
    try {
      GPULAB_CHECK(cudaSetDevice(rank));
      core::Stream stream;
      core::Event begin, end;
      const size_t largest = sizes.empty() ? 0 : sizes.back() / 4 + ranks;
      core::DeviceBuffer<float> send(largest), recv(largest);
      // Registered by every rank in the same order (the registration is collective).
      comm::SymmetricBuffer<float> symmetric_send(comms[rank], symmetric_largest / 4),
          symmetric_recv(comms[rank], symmetric_largest / 4);
      {
        std::lock_guard lock(mutex);
        symmetric = symmetric && symmetric_send.symmetric() && symmetric_recv.symmetric();
      }
      for (size_t ci = 0; ci < cases.size(); ++ci)
        for (size_t si = 0; si < sizes.size(); ++si) {
          const Collective c = cases[ci].c;
          const size_t count = send_count(c, sizes[si], 4, ranks);
          if (count == 0) continue;  // the same decision on every rank
          if (cases[ci].symmetric && sizes[si] > symmetric_largest) continue;
          float* send_at = cases[ci].symmetric ? symmetric_send.get() : send.get();
          float* recv_at = cases[ci].symmetric ? symmetric_recv.get() : recv.get();
          fill_collective_input(send_at, count, rank, stream);
          GPULAB_CHECK(cudaMemsetAsync(recv_at, 0xff, recv_count(c, count, ranks) * 4, stream));
          enqueue(c, send_at, recv_at, count, ranks, comms[rank], stream);
          const uint64_t wrong = count_collective_errors(c, recv_at, count, rank, ranks, stream);
          // Iterations per sample from the size alone, so every rank runs the same sequence.
          const int iters = int(std::clamp<size_t>((size_t(256) << 20) / sizes[si], 1, 200));
          for (int w = 0; w < std::min(iters, 5); ++w) enqueue(c, send_at, recv_at, count, ranks, comms[rank], stream);
          std::vector<double> ms;
          for (int s = 0; s < samples; ++s) {
            begin.record(stream);
            for (int it = 0; it < iters; ++it) enqueue(c, send_at, recv_at, count, ranks, comms[rank], stream);
            end.record(stream);
            end.synchronize();
            float t = 0;
            GPULAB_CHECK(cudaEventElapsedTime(&t, begin.get(), end.get()));
            ms.push_back(double(t) / iters);
          }
          std::lock_guard lock(mutex);
          results[ci][si].wrong += wrong;
          if (rank == 0) results[ci][si].ms = std::move(ms);
        }
    } catch (...) {
      // Abort this rank's communicator so the other ranks fail out of their collectives too.
      ncclCommAbort(comms[rank]);
      comms[rank] = nullptr;
      std::lock_guard lock(mutex);
      if (!failure) failure = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  for (auto& comm : comms)
    if (comm) GPULAB_CHECK_NOTHROW(ncclCommDestroy(comm));
  GPULAB_CHECK(cudaSetDevice(ctx.options().device));
  if (failure) std::rethrow_exception(failure);

  for (size_t ci = 0; ci < cases.size(); ++ci)
    for (size_t si = 0; si < sizes.size(); ++si) {
      const Collective c = cases[ci].c;
      const Measured& m = results[ci][si];
      if (m.ms.empty()) continue;
      const double factor = busbw_factor(c, ranks);
      std::vector<double> algbw, busbw;
      for (double t : m.ms) {
        algbw.push_back(per_second_1e9(double(sizes[si]), t));
        busbw.push_back(algbw.back() * factor);
      }
      const nlohmann::json params = {{"bytes", sizes[si]}, {"ranks", ranks}, {"busbw_factor", factor}, {"wrong", m.wrong},
                                     {"algbw_gbps", percentile(algbw, 50)}, {"time_us", percentile(m.ms, 50) * 1e3},
                                     {"symmetric", cases[ci].symmetric && symmetric}};
      const std::string name = std::string(collective_name(c)) + (cases[ci].symmetric ? "_symmetric_" : "_") +
                               std::to_string(sizes[si]) + "B";
      // With one rank nothing crosses a bus: report algorithm bandwidth instead.
      if (factor > 0) ctx.add(make_row("nccl", name, "busbw", "GB/s", summarize(busbw), std::nullopt, params));
      else ctx.add(make_row("nccl", name, "algbw", "GB/s", summarize(algbw), std::nullopt, params));
      if (m.wrong) ctx.fail(name + " has " + std::to_string(m.wrong) + " wrong elements over all ranks");
    }
  if (sizes.empty()) ctx.note("skipped: not enough free device memory for the smallest size");
  if (!symmetric && symmetric_largest > 0) ctx.note("all_reduce_symmetric rows ran over plain memory: NCCL gave no symmetric window");
  int version = 0;
  GPULAB_CHECK(ncclGetVersion(&version));
  ctx.note(std::to_string(ranks) + " rank(s), NCCL " + std::to_string(version) + ", fp32 sum; NCCL_NVLS_ENABLE=" +
           (getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "unset"));
  ctx.finish("nccl (" + std::to_string(ranks) + " GPUs)");
}

}  // namespace gpulab::bench
