// libgpulab_trace.so: loaded into a CUDA program by the driver through CUDA_INJECTION64_PATH
// (set by `gpulab diagnose`). It records CUPTI activity (kernels, copies, memsets, runtime and
// driver calls, unified-memory counters, NVTX ranges), samples NVML every 50 ms, and at exit (or
// SIGINT / SIGTERM, or after GPULAB_TRACE_DURATION seconds) writes process-<pid>.json, a Chrome
// trace in the layout trace/chrome_trace.h reads, into GPULAB_TRACE_DIR.
//
// Nothing here may throw into the host program: failures are printed once and tracing stops.
#include <cuda.h>
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "core/nvml.h"
#include "trace/chrome_trace.h"
#include "trace/collect.h"
#include "trace/nvtx.h"
#include "trace/trace.h"

namespace gpulab::trace {
namespace {

constexpr size_t kBufferBytes = 8 << 20;
constexpr size_t kBufferAlign = 8;

void warn(const char* what, CUptiResult status) {
  const char* text = nullptr;
  cuptiGetResultString(status, &text);
  std::fprintf(stderr, "gpulab trace: %s failed: %s\n", what, text ? text : "unknown CUPTI error");
  // CUPTI's API as used here takes one subscriber a process, and the NVIDIA tools are one.
  if (status == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    std::fprintf(stderr, "gpulab trace: another CUPTI tool holds this process (Nsight Systems or Compute, "
                         "compute-sanitizer, cuda-gdb, a framework's profiler): trace it without that tool\n");
}

bool cupti_ok(CUptiResult status, const char* what) {
  if (status != CUPTI_SUCCESS) warn(what, status);
  return status == CUPTI_SUCCESS;
}
#define TRACE_CUPTI(call) cupti_ok((call), #call)

std::atomic<int64_t> g_dropped{0};

class Collector {
 public:
  static Collector& get() {
    static Collector* instance = new Collector;  // never destroyed: CUPTI may call back late
    return *instance;
  }

  bool start(const char* out_dir);
  void finalize();
  void add_records(uint8_t* buffer, size_t valid);
  void on_signal(int sig);

 private:
  void sample_loop();
  void take_sample();
  void describe_devices();
  std::string api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid);

  std::mutex mutex_;  // guards trace_, names_ and markers_
  Trace trace_;
  MarkerMatcher markers_;
  std::map<std::pair<int, unsigned>, std::string> names_;
  std::string out_path_;
  std::atomic<bool> finished_{false};
  std::once_flag finalize_once_;
  std::thread sampler_;
  int wake_pipe_[2] = {-1, -1};  // signal handler -> sampler thread
  double duration_s_ = 0;
  int sample_ms_ = 50;
  std::vector<std::string> bus_ids_;  // per CUDA device ordinal
  pid_t pid_ = 0;                     // a forked child inherits the records but must not write them
  std::vector<int> our_signals_;      // signals whose handler we installed
};

std::string demangle(const char* name) {
  if (!name) return "<unknown>";
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && out ? out : name;
  std::free(out);
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  Collector::get().add_records(buffer, valid);
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped > 0)
    g_dropped += int64_t(dropped);
  std::free(buffer);
}

std::string Collector::api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  auto [it, inserted] = names_.emplace(std::pair{int(domain), unsigned(cbid)}, "");
  if (inserted) {
    const char* name = nullptr;
    cuptiGetCallbackName(domain, cbid, &name);
    std::string s = name ? name : "cbid_" + std::to_string(cbid);
    // "cudaLaunchKernel_v7000", "cuMemcpyHtoD_v2": the version suffix only adds noise.
    const auto v = s.rfind("_v");
    if (v != std::string::npos && v + 2 < s.size() && s.find_first_not_of("0123456789", v + 2) == std::string::npos)
      s.resize(v);
    it->second = s;
  }
  return it->second;
}

void Collector::add_records(uint8_t* buffer, size_t valid) {
  std::lock_guard lock(mutex_);
  if (finished_) return;
  CUpti_Activity* record = nullptr;
  // A forced flush (finalize, e.g. at the --duration deadline) also hands over records of work
  // still queued or running, with zero timestamps: they did not happen inside the traced window.
  const auto incomplete = [](uint64_t start, uint64_t end) { return start == 0 || end == 0 || end < start; };
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* r = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        if (incomplete(r->start, r->end)) break;
        Kernel k;
        k.name = demangle(r->name);
        k.start_ns = int64_t(r->start);
        k.end_ns = int64_t(r->end);
        k.device = int(r->deviceId);
        k.stream = r->streamId;
        k.correlation = r->correlationId;
        k.grid = {r->gridX, r->gridY, r->gridZ};
        k.block = {r->blockX, r->blockY, r->blockZ};
        k.registers = r->registersPerThread;
        k.shared_memory = int64_t(r->staticSharedMemory) + r->dynamicSharedMemory;
        trace_.kernels.push_back(std::move(k));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* r = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        if (incomplete(r->start, r->end)) break;
        Memcpy m;
        m.start_ns = int64_t(r->start);
        m.end_ns = int64_t(r->end);
        m.device = int(r->deviceId);
        m.stream = r->streamId;
        m.correlation = r->runtimeCorrelationId ? r->runtimeCorrelationId : r->correlationId;
        m.kind = CopyKind(r->copyKind);
        m.src = MemoryKind(r->srcKind);
        m.dst = MemoryKind(r->dstKind);
        m.bytes = int64_t(r->bytes);
        trace_.memcpys.push_back(m);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* r = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        if (incomplete(r->start, r->end)) break;
        Memset m;
        m.start_ns = int64_t(r->start);
        m.end_ns = int64_t(r->end);
        m.device = int(r->deviceId);
        m.stream = r->streamId;
        m.correlation = r->correlationId;
        m.dst = MemoryKind(r->memoryKind);
        m.bytes = int64_t(r->bytes);
        trace_.memsets.push_back(m);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* r = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        if (incomplete(r->start, r->end)) break;
        const bool driver = record->kind == CUPTI_ACTIVITY_KIND_DRIVER;
        ApiCall c;
        c.name = api_name(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, r->cbid);
        c.start_ns = int64_t(r->start);
        c.end_ns = int64_t(r->end);
        c.thread = r->threadId;
        c.correlation = r->correlationId;
        c.driver = driver;
        trace_.api_calls.push_back(std::move(c));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MARKER: {
        const auto* r = reinterpret_cast<const CUpti_ActivityMarker2*>(record);
        MarkerRecord m;
        m.kind = r->flags & CUPTI_ACTIVITY_FLAG_MARKER_START ? MarkerRecord::Kind::start
                 : r->flags & CUPTI_ACTIVITY_FLAG_MARKER_END ? MarkerRecord::Kind::end
                                                             : MarkerRecord::Kind::instant;
        m.id = r->id;
        m.time_ns = int64_t(r->timestamp);
        m.name = r->name ? r->name : "";
        m.domain = r->domain ? r->domain : "";
        if (r->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD) m.thread = r->objectId.pt.threadId;
        markers_.add(m, trace_.ranges);
        break;
      }
      case CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER: {
        const auto* r = reinterpret_cast<const CUpti_ActivityUnifiedMemoryCounter3*>(record);
        if (r->start == 0) break;  // end is 0 for instantaneous counters (faults)
        UmEvent u;
        switch (r->counterKind) {
          case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD: u.kind = UmKind::htod_migration; break;
          case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH: u.kind = UmKind::dtoh_migration; break;
          case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT: u.kind = UmKind::cpu_fault; break;
          case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT: u.kind = UmKind::gpu_fault; break;
          case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING: u.kind = UmKind::thrashing; break;
          case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THROTTLING: u.kind = UmKind::throttling; break;
          default: continue;
        }
        u.start_ns = int64_t(r->start);
        u.end_ns = std::max(int64_t(r->end), int64_t(r->start));
        u.address = r->address;
        u.value = int64_t(r->value);
        // Migrations name their destination; faults their processor.
        u.device = int(u.kind == UmKind::dtoh_migration ? r->srcId : r->dstId);
        if (u.device > 64) u.device = 0;  // CPU ids are large; keep the event on GPU 0's row
        trace_.um_events.push_back(u);
        break;
      }
      default: break;
    }
  }
}

// Unified-memory counters: not every system supports them (e.g. some virtualised GPUs).
bool enable_um_counters() {
  const CUpti_ActivityUnifiedMemoryCounterKind kinds[] = {
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING,
  };
  // Try all counters, then without the fault and thrashing ones some systems reject.
  for (size_t n : {size_t(5), size_t(2)}) {
    std::vector<CUpti_ActivityUnifiedMemoryCounterConfig> configs(n);
    for (size_t i = 0; i < n; ++i) {
      configs[i].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE;
      configs[i].kind = kinds[i];
      configs[i].deviceId = 0;
      configs[i].enable = 1;
    }
    if (cuptiActivityConfigureUnifiedMemoryCounter(configs.data(), uint32_t(n)) == CUPTI_SUCCESS &&
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER) == CUPTI_SUCCESS)
      return true;
  }
  return false;
}

extern "C" void handle_signal(int sig) {
  Collector::get().on_signal(sig);
}

bool Collector::start(const char* out_dir) {
  pid_ = getpid();
  out_path_ = std::string(out_dir) + "/process-" + std::to_string(pid_) + ".json";
  if (const char* d = std::getenv(kEnvDuration)) duration_s_ = std::atof(d);
  if (const char* s = std::getenv(kEnvSampleMs)) sample_ms_ = std::max(1, std::atoi(s));
  {
    std::ifstream cmdline("/proc/self/cmdline");
    std::getline(cmdline, trace_.source, '\0');
  }
  if (!TRACE_CUPTI(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed))) return false;
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER})
    if (!TRACE_CUPTI(cuptiActivityEnable(kind))) return false;
  // NVTX ranges reach CUPTI only through InitializeInjectionNvtx2 below; without them the rest still works.
  TRACE_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MARKER));
  core::Nvml::get();  // constructed before our atexit handler is registered, so it outlives it
  if (pipe(wake_pipe_) != 0) wake_pipe_[0] = wake_pipe_[1] = -1;
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction old {};
    sigaction(sig, nullptr, &old);
    if (old.sa_handler != SIG_DFL) continue;  // the program handles it and will exit normally
    struct sigaction sa {};
    sa.sa_handler = handle_signal;
    sigaction(sig, &sa, nullptr);
    our_signals_.push_back(sig);
  }
  sampler_ = std::thread([this] { sample_loop(); });
  std::atexit([] { Collector::get().finalize(); });
  return true;
}

void Collector::on_signal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (wake_pipe_[1] < 0 || write(wake_pipe_[1], &byte, 1) != 1) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void Collector::describe_devices() {
  int count = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&count) != CUDA_SUCCESS) return;
  std::lock_guard lock(mutex_);
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    if (cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    char name[256] = {}, bus[64] = {};
    cuDeviceGetName(name, sizeof name, dev);
    cuDeviceGetPCIBusId(bus, sizeof bus, dev);
    int sms = 0, major = 0, minor = 0;
    cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    trace_.devices[i].name = name;
    trace_.devices[i].sm_count = sms;
    trace_.devices[i].compute_major = major;
    trace_.devices[i].compute_minor = minor;
    bus_ids_.push_back(bus);
  }
}

void Collector::take_sample() {
  core::Nvml& nvml = core::Nvml::get();
  if (!nvml.available()) return;
  uint64_t now = 0;
  cuptiGetTimestamp(&now);
  for (size_t i = 0; i < bus_ids_.size(); ++i) {
    const std::string& bus = bus_ids_[i];
    NvmlSample s;
    s.time_ns = int64_t(now);
    s.device = int(i);
    if (auto u = nvml.utilization(bus)) s.sm_util_percent = u->gpu_percent, s.mem_util_percent = u->memory_percent;
    if (auto v = nvml.pcie_rx_kbps(bus)) s.pcie_rx_mbps = *v / 1000.0;
    if (auto v = nvml.pcie_tx_kbps(bus)) s.pcie_tx_mbps = *v / 1000.0;
    if (auto v = nvml.power_watts(bus)) s.power_w = *v;
    if (auto v = nvml.sm_clock_mhz(bus)) s.sm_clock_mhz = *v;
    if (auto v = nvml.mem_clock_mhz(bus)) s.mem_clock_mhz = *v;
    const auto gen = nvml.pcie_generation(bus), width = nvml.pcie_width(bus);
    std::lock_guard lock(mutex_);
    trace_.samples.push_back(s);
    // The link trains down when idle; the fastest state seen under load is its ceiling.
    DeviceInfo& d = trace_.devices[int(i)];
    if (gen && width && int(*gen * 100 + *width) > d.pcie_generation * 100 + d.pcie_width)
      d.pcie_generation = int(*gen), d.pcie_width = int(*width);
  }
}

void Collector::sample_loop() {
  describe_devices();
  {
    // CUPTI takes the UM counter setup only after driver initialisation, so not from the
    // injection entry point (which runs inside cuInit).
    const bool enabled = enable_um_counters();
    std::lock_guard lock(mutex_);
    trace_.um_counters_enabled = enabled;
  }
  const auto begin = std::chrono::steady_clock::now();
  while (!finished_) {
    take_sample();
    pollfd p{wake_pipe_[0], POLLIN, 0};
    if (wake_pipe_[0] >= 0 && poll(&p, 1, sample_ms_) > 0) {
      unsigned char sig = 0;
      if (read(wake_pipe_[0], &sig, 1) == 1) {
        finalize();
        signal(sig, SIG_DFL);
        kill(getpid(), sig);
        return;
      }
    } else if (wake_pipe_[0] < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sample_ms_));
    }
    if (duration_s_ > 0 && std::chrono::steady_clock::now() - begin >= std::chrono::duration<double>(duration_s_)) {
      finalize();
      return;
    }
  }
}

void Collector::finalize() {
  if (getpid() != pid_) return;
  std::call_once(finalize_once_, [this] {
    // Nobody reads the wake-up pipe from now on: signals get their default action back.
    for (int sig : our_signals_) {
      struct sigaction now {};
      sigaction(sig, nullptr, &now);
      if (now.sa_handler == handle_signal) signal(sig, SIG_DFL);
    }
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    {
      uint64_t now = 0;
      cuptiGetTimestamp(&now);
      std::lock_guard lock(mutex_);
      markers_.close_open(int64_t(now), trace_.ranges);
      finished_ = true;
    }
    for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                    CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
                                    CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER, CUPTI_ACTIVITY_KIND_MARKER})
      cuptiActivityDisable(kind);
    if (sampler_.joinable() && sampler_.get_id() != std::this_thread::get_id()) sampler_.join();
    std::string text;
    {
      std::lock_guard lock(mutex_);
      trace_.dropped_records = g_dropped;
      try {
        text = chrome_trace_json(trace_);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gpulab trace: cannot write the trace: %s\n", e.what());
        return;
      }
    }
    const std::string tmp = out_path_ + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0 ||
        std::rename(tmp.c_str(), out_path_.c_str()) != 0)
      std::fprintf(stderr, "gpulab trace: cannot write %s: %s\n", out_path_.c_str(), std::strerror(errno));
  });
}

}  // namespace
}  // namespace gpulab::trace

// Called by the CUDA driver during cuInit when CUDA_INJECTION64_PATH names this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  const char* dir = std::getenv(gpulab::trace::kEnvOutDir);
  if (!dir || !*dir) return 1;  // loaded outside gpulab diagnose: stay inert
  try {
    return gpulab::trace::Collector::get().start(dir) ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpulab trace: not tracing: %s\n", e.what());
    return 0;
  }
}

// Called by NVTX at the program's first NVTX call when NVTX_INJECTION64_PATH names this library
// (gpulab diagnose sets it). CUPTI documents pointing NVTX_INJECTION64_PATH at the libcupti the
// tool uses; forwarding to that library's handler does the same without gpulab having to find it.
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(const void* (*export_table)(uint32_t)) {
  if (!std::getenv(gpulab::trace::kEnvOutDir)) return 0;  // loaded outside gpulab diagnose: NVTX stays off
  Dl_info cupti{};
  if (!dladdr(reinterpret_cast<void*>(&cuptiActivityEnable), &cupti) || !cupti.dli_fname) return 0;
  void* handle = dlopen(cupti.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  using Init = int (*)(const void* (*)(uint32_t));
  const auto init = handle ? reinterpret_cast<Init>(dlsym(handle, "InitializeInjectionNvtx2")) : nullptr;
  if (!init) {
    std::fprintf(stderr, "gpulab trace: no NVTX ranges: %s has no InitializeInjectionNvtx2\n", cupti.dli_fname);
    return 0;
  }
  return init(export_table);
}
