#include "core/nvml.h"

#include <dlfcn.h>

namespace gpulab::core {

namespace {

// The subset of NVML's C ABI that gpulab calls, declared from the public NVML API reference
// (all handles are opaque pointers, all results an int where 0 is success).
using nvmlReturn = int;
using nvmlDevice = void*;
constexpr nvmlReturn kNvmlSuccess = 0;
constexpr unsigned kClockSm = 1;
constexpr unsigned kClockMem = 2;
constexpr unsigned kTemperatureGpu = 0;
constexpr unsigned kPcieTx = 0;
constexpr unsigned kPcieRx = 1;
constexpr unsigned kMaxNvLinks = 18;
struct nvmlUtilizationRaw {
  unsigned gpu;
  unsigned memory;
};
struct nvmlMemoryRaw {
  unsigned long long total, free, used;
};

}  // namespace

Nvml& Nvml::get() {
  static Nvml instance;
  return instance;
}

Nvml::Nvml() {
  handle_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    reason_ = "libnvidia-ml.so.1 not found (no NVIDIA driver installed?)";
    return;
  }
  auto init = reinterpret_cast<nvmlReturn (*)()>(symbol("nvmlInit_v2"));
  if (!init || init() != kNvmlSuccess) {
    reason_ = "nvmlInit failed (driver not loaded?)";
    ::dlclose(handle_);
    handle_ = nullptr;
  }
}

Nvml::~Nvml() {
  if (!handle_) return;
  if (auto shutdown = reinterpret_cast<nvmlReturn (*)()>(symbol("nvmlShutdown"))) shutdown();
  ::dlclose(handle_);
}

void* Nvml::symbol(const char* name) { return handle_ ? ::dlsym(handle_, name) : nullptr; }

void* Nvml::device(const std::string& bus_id) {
  auto fn = reinterpret_cast<nvmlReturn (*)(const char*, nvmlDevice*)>(
      symbol("nvmlDeviceGetHandleByPciBusId_v2"));
  nvmlDevice dev = nullptr;
  if (!fn || fn(bus_id.c_str(), &dev) != kNvmlSuccess) return nullptr;
  return dev;
}

// Calls an NVML getter `fn(device, args..., &out)` and returns out on success.
template <class Out, class... Args>
static std::optional<Out> query(void* fn_ptr, void* dev, Args... args) {
  if (!fn_ptr || !dev) return std::nullopt;
  auto fn = reinterpret_cast<nvmlReturn (*)(nvmlDevice, Args..., Out*)>(fn_ptr);
  Out out{};
  if (fn(dev, args..., &out) != kNvmlSuccess) return std::nullopt;
  return out;
}

std::optional<std::string> Nvml::driver_version() {
  auto fn = reinterpret_cast<nvmlReturn (*)(char*, unsigned)>(symbol("nvmlSystemGetDriverVersion"));
  char buf[96] = {};
  if (!fn || fn(buf, sizeof buf) != kNvmlSuccess) return std::nullopt;
  return std::string(buf);
}

std::optional<unsigned> Nvml::sm_clock_mhz(const std::string& id) {
  return query<unsigned>(symbol("nvmlDeviceGetClockInfo"), device(id), kClockSm);
}
std::optional<unsigned> Nvml::mem_clock_mhz(const std::string& id) {
  return query<unsigned>(symbol("nvmlDeviceGetClockInfo"), device(id), kClockMem);
}
std::optional<unsigned> Nvml::max_sm_clock_mhz(const std::string& id) {
  return query<unsigned>(symbol("nvmlDeviceGetMaxClockInfo"), device(id), kClockSm);
}
std::optional<unsigned> Nvml::max_mem_clock_mhz(const std::string& id) {
  return query<unsigned>(symbol("nvmlDeviceGetMaxClockInfo"), device(id), kClockMem);
}

std::optional<bool> Nvml::mig_enabled(const std::string& id) {
  auto fn = reinterpret_cast<nvmlReturn (*)(nvmlDevice, unsigned*, unsigned*)>(symbol("nvmlDeviceGetMigMode"));
  void* dev = device(id);
  unsigned current = 0, pending = 0;
  if (!fn || !dev || fn(dev, &current, &pending) != kNvmlSuccess) return std::nullopt;
  return current == 1;
}

std::optional<std::vector<NvmlMigInstance>> Nvml::mig_instances(const std::string& id) {
  void* dev = device(id);
  auto max_count = query<unsigned>(symbol("nvmlDeviceGetMaxMigDeviceCount"), dev);
  auto by_index = symbol("nvmlDeviceGetMigDeviceHandleByIndex");
  auto get_uuid = reinterpret_cast<nvmlReturn (*)(nvmlDevice, char*, unsigned)>(symbol("nvmlDeviceGetUUID"));
  auto get_name = reinterpret_cast<nvmlReturn (*)(nvmlDevice, char*, unsigned)>(symbol("nvmlDeviceGetName"));
  if (!max_count || !by_index) return std::nullopt;
  std::vector<NvmlMigInstance> out;
  for (unsigned i = 0; i < *max_count; ++i) {
    auto mig = query<nvmlDevice>(by_index, dev, i);
    if (!mig || !*mig) continue;
    NvmlMigInstance inst{i, "", "", 0};
    char buf[96] = {};
    if (get_uuid && get_uuid(*mig, buf, sizeof buf) == kNvmlSuccess) inst.uuid = buf;
    if (get_name && get_name(*mig, buf, sizeof buf) == kNvmlSuccess) inst.name = buf;
    if (auto mem = query<nvmlMemoryRaw>(symbol("nvmlDeviceGetMemoryInfo"), *mig)) inst.memory_total = mem->total;
    out.push_back(inst);
  }
  return out;
}

std::optional<std::vector<bool>> Nvml::nvlink_active(const std::string& id) {
  void* dev = device(id);
  void* fn = symbol("nvmlDeviceGetNvLinkState");
  if (!fn || !dev) return std::nullopt;
  std::vector<bool> links;
  for (unsigned link = 0; link < kMaxNvLinks; ++link) {
    auto state = query<unsigned>(fn, dev, link);
    if (!state) break;  // past the last link, or NVLink not supported
    links.push_back(*state == 1);
  }
  return links;
}

std::optional<unsigned> Nvml::pcie_generation(const std::string& id) {
  return query<unsigned>(symbol("nvmlDeviceGetCurrPcieLinkGeneration"), device(id));
}
std::optional<unsigned> Nvml::pcie_width(const std::string& id) {
  return query<unsigned>(symbol("nvmlDeviceGetCurrPcieLinkWidth"), device(id));
}
std::optional<double> Nvml::power_watts(const std::string& id) {
  auto mw = query<unsigned>(symbol("nvmlDeviceGetPowerUsage"), device(id));
  return mw ? std::optional<double>(*mw / 1000.0) : std::nullopt;
}
std::optional<double> Nvml::power_limit_watts(const std::string& id) {
  auto mw = query<unsigned>(symbol("nvmlDeviceGetEnforcedPowerLimit"), device(id));
  return mw ? std::optional<double>(*mw / 1000.0) : std::nullopt;
}
std::optional<unsigned> Nvml::temperature_c(const std::string& id) {
  return query<unsigned>(symbol("nvmlDeviceGetTemperature"), device(id), kTemperatureGpu);
}
std::optional<unsigned long long> Nvml::clock_event_reasons(const std::string& id) {
  void* fn = symbol("nvmlDeviceGetCurrentClocksEventReasons");  // the name since NVML 12.2
  if (!fn) fn = symbol("nvmlDeviceGetCurrentClocksThrottleReasons");
  return query<unsigned long long>(fn, device(id));
}
std::optional<NvmlUtilization> Nvml::utilization(const std::string& id) {
  auto u = query<nvmlUtilizationRaw>(symbol("nvmlDeviceGetUtilizationRates"), device(id));
  return u ? std::optional<NvmlUtilization>({u->gpu, u->memory}) : std::nullopt;
}
std::optional<unsigned> Nvml::pcie_tx_kbps(const std::string& id) {
  return query<unsigned>(symbol("nvmlDeviceGetPcieThroughput"), device(id), kPcieTx);
}
std::optional<unsigned> Nvml::pcie_rx_kbps(const std::string& id) {
  return query<unsigned>(symbol("nvmlDeviceGetPcieThroughput"), device(id), kPcieRx);
}

}  // namespace gpulab::core
