#include "trace/nvtx.h"

#include <algorithm>

namespace gpulab::trace {

void MarkerMatcher::add(const MarkerRecord& m, std::vector<NvtxRange>& out) {
  if (m.time_ns == 0) return;
  if (m.kind == MarkerRecord::Kind::start) {
    NvtxRange& r = open_[m.id];
    r = NvtxRange{};
    r.name = m.name;
    r.domain = m.domain;
    r.start_ns = m.time_ns;
    r.thread = m.thread;
  } else if (m.kind == MarkerRecord::Kind::end) {
    const auto it = open_.find(m.id);
    if (it == open_.end()) return;
    it->second.end_ns = std::max(m.time_ns, it->second.start_ns);
    out.push_back(std::move(it->second));
    open_.erase(it);
  }
}

void MarkerMatcher::close_open(int64_t end_ns, std::vector<NvtxRange>& out) {
  std::vector<NvtxRange> closed;
  for (auto& [id, r] : open_) {
    r.end_ns = std::max(end_ns, r.start_ns);
    closed.push_back(std::move(r));
  }
  open_.clear();
  // In start order, as the ids' hash order says nothing.
  std::sort(closed.begin(), closed.end(),
            [](const NvtxRange& a, const NvtxRange& b) { return a.start_ns < b.start_ns; });
  out.insert(out.end(), closed.begin(), closed.end());
}

}  // namespace gpulab::trace
