#include "comm/symmetric_buffer.h"

#include <atomic>
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

SymmetricMemory::SymmetricMemory(ncclComm_t comm, size_t bytes) : comm_(comm), bytes_(bytes) {
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
    const ncclResult_t r = ncclCommWindowRegister(comm, ptr_, bytes, &window_, NCCL_WIN_COLL_SYMMETRIC);
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
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    window_ = std::exchange(o.window_, nullptr);
    from_nccl_ = std::exchange(o.from_nccl_, false);
    device_ = o.device_;
  }
  return *this;
}

void SymmetricMemory::reset() noexcept {
  // An aborted communicator (forgotten) is gone, and its windows with it: only the memory is left to free.
  if (window_ && comm_) GPULAB_CHECK_NOTHROW(ncclCommWindowDeregister(comm_, window_));
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
  ptr_ = nullptr;
  bytes_ = 0;
  window_ = nullptr;
  from_nccl_ = false;
}

}  // namespace gpulab::comm
