#include "comm/communicator.h"

#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace gpulab::comm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::microseconds(100);

static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId), "UniqueId must hold an ncclUniqueId");

// A run_ranks group: cancelled once any rank failed, and the rank that failed first.
struct Group {
  std::atomic<bool> cancel{false};
  std::atomic<int> cause{-1};
};
// The group this thread is a rank of (null elsewhere), and its rank.
thread_local Group* tls_group = nullptr;
thread_local int tls_rank = -1;

ncclDataType_t nccl_type(core::DType dt) {
  switch (dt) {
    case core::DType::f64: return ncclFloat64;
    case core::DType::f32: return ncclFloat32;
    case core::DType::f16: return ncclFloat16;
    case core::DType::bf16: return ncclBfloat16;
    case core::DType::i64: return ncclInt64;
    case core::DType::i32: return ncclInt32;
    case core::DType::i8: return ncclInt8;
    case core::DType::u8: return ncclUint8;
    default: throw core::InputError("NCCL has no " + std::string(core::dtype_name(dt)) + " type");
  }
}

}  // namespace

bool cancelled() { return tls_group && tls_group->cancel.load(std::memory_order_relaxed); }

void cancel_group() {
  if (!tls_group) return;
  int none = -1;
  tls_group->cause.compare_exchange_strong(none, tls_rank);
  tls_group->cancel = true;
}

UniqueId make_unique_id() {
  ncclUniqueId id;
  GPULAB_CHECK(ncclGetUniqueId(&id));
  UniqueId out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

Communicator::Communicator(const UniqueId& id, int rank, int world, int device, CommOptions opt)
    : rank_(rank), world_(world), device_(device), opt_(opt) {
  if (world < 1 || rank < 0 || rank >= world)
    throw core::InputError("communicator: rank " + std::to_string(rank) + " is outside a world of " + std::to_string(world));
  GPULAB_CHECK(cudaSetDevice(device));
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once: the watchdog below decides how long to wait
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, world, nid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw core::GpuError("rank " + std::to_string(rank) + ": ncclCommInitRankConfig failed: " + core::status_string(r));
  }
  settle(r, "joining the communicator");  // on failure fail() has aborted comm_
}

Communicator::~Communicator() {
  if (!comm_ || aborted_) return;
  // Unwinding, or a sibling rank failed: a peer may be waiting on us, aborting or gone, so a
  // flush could wait forever (or for the whole timeout).
  bool abort = std::uncaught_exceptions() > 0 || cancelled();
  if (!abort) {
    ncclResult_t r = ncclCommFinalize(comm_);
    const auto end = Clock::now() + opt_.timeout;
    while (r == ncclInProgress && Clock::now() < end) {
      std::this_thread::sleep_for(kPoll);
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
    }
    abort = r != ncclSuccess;
    if (abort) core::log_warn("rank " + std::to_string(rank_) + ": NCCL communicator did not flush; aborting it");
  }
  GPULAB_CHECK_NOTHROW(abort ? ncclCommAbort(comm_) : ncclCommDestroy(comm_));
}

void Communicator::fail(const std::string& why) {
  // Sibling threads first: they abort too, from their own watchdogs, rather than wait for a
  // collective that this abort ends. NCCL frees a process's shared resources only when its last
  // communicator is aborted or destroyed.
  cancel_group();
  if (comm_ && !aborted_) GPULAB_CHECK_NOTHROW(ncclCommAbort(comm_));
  aborted_ = true;
  throw core::Error("rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": " + why);
}

template <class Query>
void Communicator::watch(Query&& done, const char* what) {
  if (aborted_) throw core::Error("rank " + std::to_string(rank_) + ": the communicator was aborted before " + what);
  const auto start = Clock::now();
  for (;;) {
    if (done()) return;
    ncclResult_t async = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &async);
    if (q != ncclSuccess) async = q;
    if (async != ncclSuccess && async != ncclInProgress)
      fail(std::string("NCCL failed while ") + what + ": " + core::status_string(async) + " (" +
           ncclGetLastError(comm_) + "); a peer rank may have died");
    if (cancelled()) fail(std::string("stopped while ") + what + " because another rank failed");
    if (Clock::now() - start > opt_.timeout)
      fail(std::string("no progress while ") + what + " for " + seconds_text(opt_.timeout) +
           ": a peer rank died or hangs (the communicator was aborted)");
    std::this_thread::sleep_for(kPoll);
  }
}

void Communicator::settle(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  if (r != ncclInProgress) fail(std::string("NCCL failed while ") + what + ": " + core::status_string(r));
  watch(
      [&] {
        ncclResult_t s = ncclInProgress;
        ncclCommGetAsyncError(comm_, &s);
        return s == ncclSuccess;  // errors are reported by watch()'s own poll
      },
      what);
}

void Communicator::all_reduce(const void* send, void* recv, size_t count, core::DType dtype, ReduceOp op,
                              cudaStream_t stream) {
  if (world_ == 1) {
    // The identity, whatever the op. NCCL 2.28.3's one-rank fp32 average left the last
    // count % 4 elements of an out-of-place result unwritten on the H200.
    if (send != recv)
      GPULAB_CHECK(cudaMemcpyAsync(recv, send, count * core::dtype_size(dtype), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  settle(ncclAllReduce(send, recv, count, nccl_type(dtype), op == ReduceOp::avg ? ncclAvg : ncclSum, comm_, stream),
         "enqueueing an all-reduce");
}

void Communicator::broadcast(const void* send, void* recv, size_t count, core::DType dtype, int root,
                             cudaStream_t stream) {
  settle(ncclBroadcast(send, recv, count, nccl_type(dtype), root, comm_, stream), "enqueueing a broadcast");
}

void Communicator::all_gather(const void* send, void* recv, size_t count, core::DType dtype, cudaStream_t stream) {
  settle(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream), "enqueueing an all-gather");
}

namespace {
// A cudaStreamQuery/cudaEventQuery result as "done?", throwing on a real error.
bool finished(cudaError_t e) {
  if (e == cudaErrorNotReady) return false;
  GPULAB_CHECK(e);
  return true;
}
}  // namespace

void Communicator::wait(cudaStream_t stream) {
  watch([&] { return finished(cudaStreamQuery(stream)); }, "waiting for collectives");
}

void Communicator::wait(cudaEvent_t event) {
  watch([&] { return finished(cudaEventQuery(event)); }, "waiting for collectives");
}

void Communicator::check() {
  watch([] { return true; }, "checking the communicator");
  ncclResult_t async = ncclSuccess;
  GPULAB_CHECK(ncclCommGetAsyncError(comm_, &async));
  if (async != ncclSuccess && async != ncclInProgress)
    fail("NCCL reported " + core::status_string(async) + " (" + ncclGetLastError(comm_) + ")");
}

void run_ranks(int n, const std::function<void(int rank)>& fn) {
  if (n < 1) throw core::InputError("need at least one rank");
  Group group;
  std::mutex mutex;
  std::exception_ptr first;  // the first to land
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));  // by rank
  std::vector<std::thread> threads;
  threads.reserve(size_t(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      tls_group = &group;
      tls_rank = r;
      try {
        fn(r);
      } catch (...) {
        cancel_group();
        std::lock_guard lock(mutex);
        errors[size_t(r)] = std::current_exception();
        if (!first) first = errors[size_t(r)];
      }
      tls_group = nullptr;
      tls_rank = -1;
    });
  }
  for (auto& t : threads) t.join();
  // The cause, not the others' "stopped because another rank failed", which may land first.
  const int cause = group.cause.load();
  if (cause >= 0 && errors[size_t(cause)]) std::rethrow_exception(errors[size_t(cause)]);
  if (first) std::rethrow_exception(first);
}

void run_on_gpus(int n, const std::function<void(int rank)>& fn) {
  int count = 0;
  GPULAB_CHECK(cudaGetDeviceCount(&count));
  if (n > count)
    throw core::InputError(std::to_string(n) + " GPUs asked for, but " + std::to_string(count) + " are visible");
  run_ranks(n, [&](int rank) {
    GPULAB_CHECK(cudaSetDevice(rank));
    fn(rank);
  });
}

}  // namespace gpulab::comm
