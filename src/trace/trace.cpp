#include "trace/trace.h"

#include <algorithm>
#include <limits>

namespace gpulab::trace {

namespace {

constexpr std::array<std::string_view, 8> kMemoryKindNames = {
    "Unknown", "Pageable", "Pinned", "Device", "Array", "Managed", "Device Static", "Managed Static"};
constexpr std::array<std::string_view, 11> kCopyKindNames = {
    "Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
constexpr std::array<std::string_view, 6> kUmKindNames = {
    "htod_migration", "dtoh_migration", "cpu_fault", "gpu_fault", "thrashing", "throttling"};

template <class Enum, size_t N>
std::optional<Enum> parse_name(const std::array<std::string_view, N>& names, std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == name) return Enum(i);
  return std::nullopt;
}

template <size_t N>
std::string_view name_of(const std::array<std::string_view, N>& names, int i) {
  return i >= 0 && size_t(i) < N ? names[i] : names[0];
}

}  // namespace

std::string_view memory_kind_name(MemoryKind k) { return name_of(kMemoryKindNames, int(k)); }
std::string_view copy_kind_name(CopyKind k) { return name_of(kCopyKindNames, int(k)); }
std::string_view um_kind_name(UmKind k) { return kUmKindNames[size_t(k)]; }

std::optional<MemoryKind> parse_memory_kind(std::string_view name) {
  if (name == "Pagable") return MemoryKind::pageable;  // older Kineto's spelling
  return parse_name<MemoryKind>(kMemoryKindNames, name);
}
std::optional<CopyKind> parse_copy_kind(std::string_view name) {
  return parse_name<CopyKind>(kCopyKindNames, name);
}
std::optional<UmKind> parse_um_kind(std::string_view name) { return parse_name<UmKind>(kUmKindNames, name); }

std::string utf8_prefix(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // a continuation byte
  return std::string(text.substr(0, cut));
}

double DeviceInfo::pcie_gbps() const {
  // Per-lane one-direction GB/s after line encoding (8b/10b up to gen 2, 128b/130b from gen 3).
  constexpr std::array<double, 7> kLaneGbps = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.877};
  if (pcie_generation <= 0 || pcie_generation >= int(kLaneGbps.size()) || pcie_width <= 0) return 0;
  return kLaneGbps[pcie_generation] * pcie_width;
}

int64_t Trace::first_time_ns() const {
  int64_t first = std::numeric_limits<int64_t>::max();
  const auto see = [&](int64_t ns) { first = std::min(first, ns); };
  for (const auto& k : kernels) see(k.start_ns);
  for (const auto& m : memcpys) see(m.start_ns);
  for (const auto& m : memsets) see(m.start_ns);
  for (const auto& c : api_calls) see(c.start_ns);
  for (const auto& u : um_events) see(u.start_ns);
  for (const auto& s : samples) see(s.time_ns);
  for (const auto& r : ranges) see(r.start_ns);
  return first == std::numeric_limits<int64_t>::max() ? 0 : first;
}

}  // namespace gpulab::trace
