// RAII owners for device memory, pinned host memory, streams and events, and an event timer.
// All are move-only; destructors never throw (errors are logged).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "core/error.h"

namespace gpulab::core {

// Throws an Error naming the size asked for and the free memory when cudaMalloc fails for lack
// of memory, so "too big for this GPU" reads as such.
void* device_malloc(size_t bytes);
void* pinned_malloc(size_t bytes);

template <class T, void* (*Alloc)(size_t), cudaError_t (*Free)(void*)>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t count) : count_(count) {
    if (count) ptr_ = static_cast<T*>(Alloc(count * sizeof(T)));
  }
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  void reset() {
    if (ptr_) GPULAB_CHECK_NOTHROW(Free(ptr_));
    ptr_ = nullptr;
    count_ = 0;
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

inline cudaError_t free_device(void* p) { return cudaFree(p); }
inline cudaError_t free_pinned(void* p) { return cudaFreeHost(p); }

template <class T = std::byte>
using DeviceBuffer = Buffer<T, device_malloc, free_device>;
template <class T = std::byte>
using PinnedBuffer = Buffer<T, pinned_malloc, free_pinned>;

enum class StreamPriority { normal, high };

class Stream {
 public:
  // Non-blocking. `high` takes the device's greatest priority: its blocks are scheduled ahead of
  // normal streams' as SMs free up (a data pipeline's kernels beside a training step's).
  explicit Stream(StreamPriority priority = StreamPriority::normal) {
    int least = 0, greatest = 0;
    if (priority == StreamPriority::high) GPULAB_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    GPULAB_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking,
                                              priority == StreamPriority::high ? greatest : least));
  }
  ~Stream() {
    if (stream_) GPULAB_CHECK_NOTHROW(cudaStreamDestroy(stream_));
  }
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream& operator=(Stream&&) = delete;
  cudaStream_t get() const { return stream_; }
  operator cudaStream_t() const { return stream_; }
  void synchronize() const { GPULAB_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  explicit Event(unsigned flags = cudaEventDefault) { GPULAB_CHECK(cudaEventCreateWithFlags(&event_, flags)); }
  ~Event() {
    if (event_) GPULAB_CHECK_NOTHROW(cudaEventDestroy(event_));
  }
  Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event& operator=(Event&&) = delete;
  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream) { GPULAB_CHECK(cudaEventRecord(event_, stream)); }
  void synchronize() const { GPULAB_CHECK(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

// Times device work on one stream with a pair of events: start(); ...; stop() returns ms.
class EventTimer {
 public:
  explicit EventTimer(cudaStream_t stream) : stream_(stream) {}
  void start() { begin_.record(stream_); }
  float stop() {
    end_.record(stream_);
    end_.synchronize();
    float ms = 0.f;
    GPULAB_CHECK(cudaEventElapsedTime(&ms, begin_.get(), end_.get()));
    return ms;
  }

 private:
  cudaStream_t stream_;
  Event begin_, end_;
};

}  // namespace gpulab::core
