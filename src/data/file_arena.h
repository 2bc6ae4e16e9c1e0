// One batch's file bytes in one host buffer, page-locked by default: nvJPEG's uploads of the
// bitstreams are then asynchronous DMA on the decode stream, where pageable bytes cost a
// synchronous copy through the driver's staging buffers (~10 GB/s against ~44 GB/s on an H200).
// Regions are only appended between clear()s, so bytes already handed to a decoder are never
// overwritten; the buffer grows geometrically (rarely: page-locking and freeing are slow).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/memory.h"

namespace gpulab::data {

class FileArena {
 public:
  static constexpr size_t kAlign = 64;  // each region starts on its own cache line (parallel readers)

  explicit FileArena(bool pinned) : pinned_(pinned) {}
  // Starts a batch: every region may be overwritten. The caller guarantees that nothing reads them.
  void clear() { used_ = 0; }
  // Room for regions of `sizes`, after every region placed since clear(); returns their offsets.
  // Growing copies the regions placed so far into a larger buffer (offsets stay valid) and calls
  // `before_free` before the old buffer goes: wait there for every reader of it.
  std::vector<size_t> place(std::span<const size_t> sizes, const std::function<void()>& before_free);
  uint8_t* data() const { return pinned_ ? pinned_buf_.get() : pageable_buf_.get(); }
  size_t capacity() const { return capacity_; }
  bool pinned() const { return pinned_; }

 private:
  bool pinned_;
  size_t used_ = 0, capacity_ = 0;
  core::PinnedBuffer<uint8_t> pinned_buf_;
  std::unique_ptr<uint8_t[]> pageable_buf_;  // GPULAB_NVJPEG_PINNED=0
};

}  // namespace gpulab::data
