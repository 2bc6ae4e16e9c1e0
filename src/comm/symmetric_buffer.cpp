#include "comm/symmetric_buffer.h"

#include <atomic>
#include <exception>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"

namespace gpulab::comm {

namespace {

// Once per process: a tensor-parallel group would otherwise say it once per rank and buffer.
void say_plain_once(const std::string& why) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) core::log_info("NCCL collectives run over plain buffers, not symmetric memory: ", why);
}

}  // namespace

SymmetricMemory::SymmetricMemory(ncclComm_t comm, size_t bytes) : SymmetricMemory(comm, nullptr, bytes) {}

SymmetricMemory::SymmetricMemory(Communicator& comm, size_t bytes) : SymmetricMemory(comm.get(), &comm, bytes) {}

SymmetricMemory::SymmetricMemory(ncclComm_t comm, Communicator* owner, size_t bytes)
    : comm_(comm), owner_(owner), bytes_(bytes) {
  if (owner && owner->aborted()) throw core::Error("symmetric buffer: the communicator was aborted");
  if (bytes == 0) return;
  if (!comm) {
    ptr_ = core::device_malloc(bytes);
    return;
  }
  GPULAB_CHECK(cudaGetDevice(&device_));
  if (const ncclResult_t a = ncclMemAlloc(&ptr_, bytes); a != ncclSuccess) {
    ptr_ = core::device_malloc(bytes);
    say_plain_once("ncclMemAlloc failed (" + core::status_string(a) + ")");
    return;
  }
  from_nccl_ = true;
  try {
    // A non-blocking communicator writes window_ when the registration's group ends: a
    // Communicator's watchdog waits for that; a raw one (not used so) is polled.
    ncclResult_t r = ncclCommWindowRegister(comm, ptr_, bytes, &window_, NCCL_WIN_COLL_SYMMETRIC);
    if (r == ncclInProgress && owner) {
      owner->settle(r, "registering a symmetric buffer");
      r = ncclSuccess;
    }
    while (r == ncclInProgress) GPULAB_CHECK(ncclCommGetAsyncError(comm, &r));
    if (r != ncclSuccess) {
      window_ = nullptr;
      say_plain_once("ncclCommWindowRegister failed (" + core::status_string(r) + ")");
    } else if (!window_) {
      say_plain_once("NCCL gave no symmetric window (a communicator across nodes, GPUs without peer access, or no CUDA VMM)");
    }
  } catch (...) {
    GPULAB_CHECK_NOTHROW(ncclMemFree(ptr_));
    throw;
  }
}

SymmetricMemory& SymmetricMemory::operator=(SymmetricMemory&& o) noexcept {
  if (this != &o) {
    reset();
    comm_ = std::exchange(o.comm_, nullptr);
    owner_ = std::exchange(o.owner_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    window_ = std::exchange(o.window_, nullptr);
    from_nccl_ = std::exchange(o.from_nccl_, false);
    device_ = o.device_;
  }
  return *this;
}

void SymmetricMemory::reset() noexcept {
  // An aborted communicator is gone, and its windows with it: only the memory is left to free.
  if (window_ && comm_ && !(owner_ && owner_->aborted())) {
    const ncclResult_t r = ncclCommWindowDeregister(comm_, window_);
    try {
      if (owner_) owner_->settle(r, "deregistering a symmetric buffer");
      else GPULAB_CHECK(r);
    } catch (const std::exception& e) {
      core::log_warn("symmetric buffer: ", e.what());
    }
  }
  if (ptr_ && from_nccl_) {
    // Unmapping does not wait for kernels still using the memory.
    int current = 0;
    GPULAB_CHECK_NOTHROW(cudaGetDevice(&current));
    GPULAB_CHECK_NOTHROW(cudaSetDevice(device_));
    GPULAB_CHECK_NOTHROW(cudaDeviceSynchronize());
    GPULAB_CHECK_NOTHROW(ncclMemFree(ptr_));
    GPULAB_CHECK_NOTHROW(cudaSetDevice(current));
  } else if (ptr_) {
    GPULAB_CHECK_NOTHROW(cudaFree(ptr_));
  }
  comm_ = nullptr;
  owner_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
  window_ = nullptr;
  from_nccl_ = false;
}

}  // namespace gpulab::comm
