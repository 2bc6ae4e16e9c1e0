#include "trace/window.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"

namespace gpulab::trace {

namespace {

constexpr size_t kNamesListed = 20;

// Cuts [start, end] to the window; false when it lies outside. An instant (start == end) is kept
// when it falls inside, edges included.
bool clip(int64_t& start, int64_t& end, const AnalysisWindow& w) {
  if (start == end) return start >= w.start_ns && start <= w.end_ns;
  if (end <= w.start_ns || start >= w.end_ns) return false;
  start = std::max(start, w.start_ns);
  end = std::min(end, w.end_ns);
  return true;
}

// Clips each record (its start and end fields, and an amount spread evenly over its time) and
// keeps those inside.
template <class T, class Amount>
std::vector<T> clipped(const std::vector<T>& in, const AnalysisWindow& w, Amount amount) {
  std::vector<T> out;
  for (T r : in) {
    const int64_t before = r.end_ns - r.start_ns;
    if (!clip(r.start_ns, r.end_ns, w)) continue;
    if constexpr (!std::is_same_v<Amount, std::nullptr_t>) {
      if (before > 0) r.*amount = int64_t(double(r.*amount) * double(r.end_ns - r.start_ns) / double(before));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

AnalysisWindow capture_window(const Trace& t, const std::string& name) {
  AnalysisWindow w;
  w.range = name;
  w.trace_start_ns = t.first_time_ns();
  std::vector<std::string> names;
  for (const auto& r : t.ranges) {
    if (std::find(names.begin(), names.end(), r.name) == names.end()) names.push_back(r.name);
    if (r.name != name) continue;
    w.start_ns = w.occurrences == 0 ? r.start_ns : std::min(w.start_ns, r.start_ns);
    w.end_ns = w.occurrences == 0 ? r.end_ns : std::max(w.end_ns, r.end_ns);
    ++w.occurrences;
  }
  if (w.occurrences > 0) return w;
  if (names.empty())
    throw core::InputError("--capture-range " + name + ": " + t.source +
                           " has no NVTX or user_annotation ranges (does the program emit NVTX ranges?)");
  std::string listed;
  for (size_t i = 0; i < std::min(names.size(), kNamesListed); ++i) listed += (i ? ", " : "") + names[i];
  if (names.size() > kNamesListed) listed += " and " + std::to_string(names.size() - kNamesListed) + " more";
  throw core::InputError("--capture-range " + name + ": no range of that name in " + t.source +
                         "; its ranges are: " + listed);
}

Trace clip_to_window(const Trace& t, const AnalysisWindow& w) {
  Trace out;
  out.kernels = clipped(t.kernels, w, nullptr);
  out.memcpys = clipped(t.memcpys, w, &Memcpy::bytes);
  out.memsets = clipped(t.memsets, w, &Memset::bytes);
  out.api_calls = clipped(t.api_calls, w, nullptr);
  out.um_events = clipped(t.um_events, w, &UmEvent::value);  // faults are instants: never scaled
  out.ranges = clipped(t.ranges, w, nullptr);
  for (const auto& s : t.samples)
    if (s.time_ns >= w.start_ns && s.time_ns <= w.end_ns) out.samples.push_back(s);
  out.devices = t.devices;
  out.dropped_records = t.dropped_records;
  out.um_counters_enabled = t.um_counters_enabled;
  out.source = t.source;
  out.notes = t.notes;
  out.window = w;
  return out;
}

}  // namespace gpulab::trace
