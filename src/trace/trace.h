// The trace model `gpulab diagnose` analyses: GPU activities (kernels, copies, memsets), the host
// API calls that issued them, unified-memory events, NVML samples and NVTX ranges. It is filled either by the
// CUPTI injection library or by reading a Chrome-trace JSON (PyTorch profiler / Kineto, or ours).
// Times are nanoseconds on one clock; the origin does not matter.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpulab::trace {

// Values are CUPTI's CUpti_ActivityMemoryKind, so records convert by cast.
enum class MemoryKind : int {
  unknown = 0, pageable = 1, pinned = 2, device = 3, array = 4, managed = 5, device_static = 6,
  managed_static = 7,
};
// Values are CUPTI's CUpti_ActivityMemcpyKind.
enum class CopyKind : int {
  unknown = 0, htod = 1, dtoh = 2, htoa = 3, atoh = 4, atoa = 5, atod = 6, dtoa = 7, dtod = 8,
  htoh = 9, ptop = 10,
};

std::string_view memory_kind_name(MemoryKind k);  // Kineto's spelling: "Pageable", "Device", ...
std::string_view copy_kind_name(CopyKind k);      // "HtoD", "DtoH", ...
std::optional<MemoryKind> parse_memory_kind(std::string_view name);
std::optional<CopyKind> parse_copy_kind(std::string_view name);

// The longest prefix of UTF-8 `text` of at most `max_bytes` that ends on a character boundary:
// names shortened for notes and tables stay valid UTF-8 (a JSON report refuses anything else).
std::string utf8_prefix(std::string_view text, size_t max_bytes);

// Common fields of anything that ran on a GPU engine.
struct GpuActivity {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int device = 0;
  int64_t stream = 0;
  int64_t correlation = 0;  // links to the ApiCall that issued it; 0 = unknown
  int64_t duration_ns() const { return end_ns - start_ns; }
};

struct Kernel : GpuActivity {
  std::string name;
  std::array<int, 3> grid{1, 1, 1};
  std::array<int, 3> block{1, 1, 1};
  int registers = 0;
  int64_t shared_memory = 0;  // static + dynamic bytes per block
  int64_t blocks() const { return int64_t(grid[0]) * grid[1] * grid[2]; }
};

struct Memcpy : GpuActivity {
  CopyKind kind = CopyKind::unknown;
  MemoryKind src = MemoryKind::unknown;
  MemoryKind dst = MemoryKind::unknown;
  int64_t bytes = 0;
};

struct Memset : GpuActivity {
  MemoryKind dst = MemoryKind::unknown;
  int64_t bytes = 0;
};

// A CUDA runtime or driver API call on a host thread.
struct ApiCall {
  std::string name;  // "cudaLaunchKernel", "cuCtxSynchronize", ...
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t thread = 0;
  int64_t correlation = 0;
  bool driver = false;
};

// A unified-memory counter record (CUPTI's CUpti_ActivityUnifiedMemoryCounterKind subset).
enum class UmKind { htod_migration, dtoh_migration, cpu_fault, gpu_fault, thrashing, throttling };
std::string_view um_kind_name(UmKind k);
std::optional<UmKind> parse_um_kind(std::string_view name);

struct UmEvent {
  UmKind kind = UmKind::htod_migration;
  int64_t start_ns = 0;
  int64_t end_ns = 0;  // == start for instantaneous counters (faults)
  uint64_t address = 0;
  int64_t value = 0;  // bytes for migrations, fault count for faults
  int device = 0;
};

// One NVML sample of a device; a field is negative when NVML could not give it.
struct NvmlSample {
  int64_t time_ns = 0;
  int device = 0;
  double sm_util_percent = -1;
  double mem_util_percent = -1;
  double pcie_rx_mbps = -1;
  double pcie_tx_mbps = -1;
  double power_w = -1;
  double sm_clock_mhz = -1;
  double mem_clock_mhz = -1;
};

// An NVTX range (push/pop or start/end) of the program, or a PyTorch record_function range
// (Kineto's "user_annotation"; "gpu_user_annotation" is its projection onto a GPU stream).
struct NvtxRange {
  std::string name;
  std::string domain;  // empty = NVTX's default domain
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t thread = 0;  // host thread; the stream for a GPU projection
  bool gpu = false;    // Kineto's projection onto `device`, `thread` being the stream
  int device = 0;
};

// The part of a trace the analysis was restricted to (--capture-range): from the start of the
// first range named `range` to the end of the last one.
struct AnalysisWindow {
  std::string range;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t occurrences = 0;     // ranges of that name
  int64_t trace_start_ns = 0;  // the full trace's first record, so the window can be placed in it
};

struct DeviceInfo {
  std::string name;
  int sm_count = 0;           // 0 = unknown
  int pcie_generation = 0;    // 0 = unknown
  int pcie_width = 0;
  int compute_major = 0;      // 0 = unknown
  int compute_minor = 0;
  // Theoretical one-direction PCIe bandwidth from generation and width, GB/s; 0 if unknown.
  double pcie_gbps() const;
};

struct Trace {
  std::vector<Kernel> kernels;
  std::vector<Memcpy> memcpys;
  std::vector<Memset> memsets;
  std::vector<ApiCall> api_calls;
  std::vector<UmEvent> um_events;
  std::vector<NvmlSample> samples;
  std::vector<NvtxRange> ranges;
  std::map<int, DeviceInfo> devices;
  int64_t dropped_records = 0;
  bool um_counters_enabled = false;  // the collector managed to enable UM counters
  std::string source;                // file or command the trace came from
  std::vector<std::string> notes;    // what the reader skipped or could not use, for the report
  std::optional<AnalysisWindow> window;  // set when the records were clipped to a capture range

  // The earliest time of any record; 0 for an empty trace.
  int64_t first_time_ns() const;
};

}  // namespace gpulab::trace
