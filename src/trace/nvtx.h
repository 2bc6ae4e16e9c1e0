// NVTX ranges from CUPTI's marker records (CUPTI_ACTIVITY_KIND_MARKER): a push/pop or start/end
// range arrives as a start record carrying its name and an end record without one, matched by
// id. The two may come in different activity buffers, so the matcher keeps the open ones.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trace/trace.h"

namespace gpulab::trace {

struct MarkerRecord {
  enum class Kind { start, end, instant };  // instant: nvtxMark, not a range
  Kind kind = Kind::instant;
  uint32_t id = 0;
  int64_t time_ns = 0;  // 0: CUPTI could not take the time
  std::string_view name;
  std::string_view domain;
  int64_t thread = 0;
};

class MarkerMatcher {
 public:
  // A start is kept until its end arrives, which appends the range to `out`; instant markers,
  // records without a time and ends without a start are ignored.
  void add(const MarkerRecord& m, std::vector<NvtxRange>& out);
  // Ranges still open (the program exited, or tracing stopped, inside them) end at `end_ns`.
  void close_open(int64_t end_ns, std::vector<NvtxRange>& out);

 private:
  std::unordered_map<uint32_t, NvtxRange> open_;
};

}  // namespace gpulab::trace
