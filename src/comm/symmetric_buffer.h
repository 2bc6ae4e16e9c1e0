// Device memory that NCCL's symmetric kernels can use (NCCL 2.27+): allocated with ncclMemAlloc
// (CUDA VMM) and registered as a window with NCCL_WIN_COLL_SYMMETRIC, so collectives whose send
// and receive pointers lie at the same offset of it on every rank run NCCL's low-latency
// symmetric kernels (NVLink peer loads and stores) instead of the ring/tree ones. Sums of fp32
// and smaller types, one collective per group; the other collectives run as on plain memory.
//
// Construction is collective: every rank of the communicator makes the same constructions in
// the same order, with the same sizes, outside stream capture (collectives on the buffer may be
// captured in CUDA graphs). Where NCCL gives no window (a communicator across nodes, GPUs without
// peer access, no VMM) or the allocation or registration is refused, the buffer is plain device
// memory, symmetric() says so, and the log says so once per process. A null communicator gives a
// plain cudaMalloc buffer without any NCCL call.
//
// The communicator is a blocking one (ncclCommInitAll, ncclCommInitRank), as the tensor-parallel
// engine and bench nccl use: through the non-blocking comm::Communicator the H200 gave no window
// and the all-reduce then failed, so that path is not offered. The communicator must outlive the
// buffer; after an ncclCommAbort (which frees it), call forget_communicator() before the buffer goes.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <utility>

namespace gpulab::comm {

// The untyped memory behind SymmetricBuffer<T>.
class SymmetricMemory {
 public:
  SymmetricMemory() = default;
  // `comm` is a blocking communicator or null.
  SymmetricMemory(ncclComm_t comm, size_t bytes);
  ~SymmetricMemory() { reset(); }
  SymmetricMemory(SymmetricMemory&& o) noexcept { *this = std::move(o); }
  SymmetricMemory& operator=(SymmetricMemory&& o) noexcept;
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  bool symmetric() const { return window_ != nullptr; }
  void forget_communicator() { comm_ = nullptr; }

 private:
  void reset() noexcept;

  ncclComm_t comm_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  ncclWindow_t window_ = nullptr;
  bool from_nccl_ = false;  // ncclMemAlloc (else cudaMalloc)
  int device_ = 0;          // of an ncclMemAlloc buffer
};

template <class T>
class SymmetricBuffer {
 public:
  SymmetricBuffer() = default;
  SymmetricBuffer(ncclComm_t comm, size_t count) : mem_(comm, count * sizeof(T)), count_(count) {}
  SymmetricBuffer(SymmetricBuffer&& o) noexcept : mem_(std::move(o.mem_)), count_(std::exchange(o.count_, 0)) {}
  SymmetricBuffer& operator=(SymmetricBuffer&& o) noexcept {
    mem_ = std::move(o.mem_);
    count_ = std::exchange(o.count_, 0);
    return *this;
  }

  T* get() const { return static_cast<T*>(mem_.get()); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  bool symmetric() const { return mem_.symmetric(); }
  void forget_communicator() { mem_.forget_communicator(); }

 private:
  SymmetricMemory mem_;
  size_t count_ = 0;
};

}  // namespace gpulab::comm
