// An NCCL communicator that cannot hang the job: created non-blocking (ncclCommInitRankConfig
// with blocking = 0), so every host wait on its collectives is a watchdog loop that polls
// ncclCommGetAsyncError and, on an error, a timeout or a failed sibling thread, calls
// ncclCommAbort (which also releases kernels stuck waiting for a dead peer) and throws one clear
// error. And the thread-per-GPU launcher of single-process multi-GPU runs.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <functional>

#include "comm/bootstrap.h"
#include "core/dtype.h"

namespace gpulab::comm {

enum class ReduceOp { sum, avg };

struct CommOptions {
  // The longest init, or wait for collectives to finish, before the peers count as dead or hung.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// ncclGetUniqueId, on the rank that hands it out (rank 0).
UniqueId make_unique_id();

class Communicator {
 public:
  // One rank of `world` on `device` (made current on this thread). Every rank passes the same id.
  Communicator(const UniqueId& id, int rank, int world, int device, CommOptions opt = {});
  // Flushes and destroys; aborts instead when the watchdog fired, during exception unwinding
  // (a peer may never come), or when the flush does not finish within the timeout.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  ncclComm_t get() const { return comm_; }

  // Enqueued on `stream`; in place when send == recv. avg divides the sum by world.
  void all_reduce(const void* send, void* recv, size_t count, core::DType dtype, ReduceOp op, cudaStream_t stream);
  void broadcast(const void* send, void* recv, size_t count, core::DType dtype, int root, cudaStream_t stream);
  // recv holds world x count elements, rank r's in slot r.
  void all_gather(const void* send, void* recv, size_t count, core::DType dtype, cudaStream_t stream);

  // The watchdog wait: returns when all work so far on `stream` (or up to `event`) is done;
  // aborts the communicator and throws core::Error when NCCL reports an error, when `timeout`
  // passes first (a peer died or hangs), or when a sibling rank of run_ranks failed.
  void wait(cudaStream_t stream);
  void wait(cudaEvent_t event);
  // Throws (after aborting) if NCCL has reported an asynchronous error; does not wait.
  void check();
  bool aborted() const { return aborted_; }

 private:
  template <class Query>
  void watch(Query&& done, const char* what);
  void settle(ncclResult_t r, const char* what);  // a non-blocking call's InProgress, to its end
  [[noreturn]] void fail(const std::string& why);

  ncclComm_t comm_ = nullptr;
  int rank_, world_, device_;
  CommOptions opt_;
  bool aborted_ = false;
};

// Runs fn(rank) for rank 0..n-1, each on its own thread, and rethrows the first exception. When
// one rank throws, the others' communicators see cancelled() in their watchdog and abort, so a
// rank blocked on a collective with the failed one ends instead of hanging.
void run_ranks(int n, const std::function<void(int rank)>& fn);
// run_ranks with GPU `rank` made current on each thread; throws InputError when fewer than n
// GPUs are visible.
void run_on_gpus(int n, const std::function<void(int rank)>& fn);
// True on a run_ranks thread whose group has a failed rank.
bool cancelled();
// On a run_ranks thread: cancels its group, naming this rank the cause when none is yet, so that
// run_ranks rethrows this rank's error even if a sibling's "stopped because another rank failed"
// lands first. Elsewhere nothing. A watchdog calls it before ncclCommAbort.
void cancel_group();

}  // namespace gpulab::comm
