#include "data/file_arena.h"

#include <cstring>

namespace gpulab::data {

std::vector<size_t> FileArena::place(std::span<const size_t> sizes, const std::function<void()>& before_free) {
  std::vector<size_t> offsets(sizes.size());
  size_t end = used_;
  for (size_t k = 0; k < sizes.size(); ++k) {
    offsets[k] = end;
    end += (sizes[k] + kAlign - 1) / kAlign * kAlign;
  }
  if (end > capacity_) {
    const size_t grown = end + end / 4;  // at least 1.25x the old capacity: a batch's bytes vary a little
    core::PinnedBuffer<uint8_t> pinned;
    std::unique_ptr<uint8_t[]> pageable;
    if (pinned_) pinned = core::PinnedBuffer<uint8_t>(grown);
    else pageable = std::make_unique_for_overwrite<uint8_t[]>(grown);
    uint8_t* to = pinned_ ? pinned.get() : pageable.get();
    if (used_) std::memcpy(to, data(), used_);
    before_free();
    pinned_buf_ = std::move(pinned);
    pageable_buf_ = std::move(pageable);
    capacity_ = grown;
  }
  used_ = end;
  return offsets;
}

}  // namespace gpulab::data
