#include "core/device.h"

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"

namespace gpulab::core {

using nlohmann::json;

std::string why_no_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return "";
  cudaGetLastError();  // clear the sticky error so later calls report their own
  switch (status) {
    case cudaSuccess:
    case cudaErrorNoDevice: return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and that the GPU is attached)";
    case cudaErrorInsufficientDriver: return "no NVIDIA driver is loaded, or it is older than this CUDA " + format_cuda_version(CUDART_VERSION) + " build needs";
    default: return "CUDA could not enumerate devices: " + status_string(status);
  }
}

int require_devices() {
  const std::string why = why_no_device();
  if (!why.empty()) throw NoDeviceError(why);
  int count = 0;
  GPULAB_CHECK(cudaGetDeviceCount(&count));
  return count;
}

std::string pci_bus_id(int index) {
  char bus[32] = {};
  GPULAB_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, index));
  return bus;
}

DeviceInfo query_device(int index) {
  cudaDeviceProp prop{};
  GPULAB_CHECK(cudaGetDeviceProperties(&prop, index));
  DeviceInfo d;
  d.index = index;
  d.name = prop.name;
  d.pci_bus_id = pci_bus_id(index);
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.sm_count = prop.multiProcessorCount;
  d.l2_bytes = static_cast<uint64_t>(prop.l2CacheSize);
  d.shared_per_sm = prop.sharedMemPerMultiprocessor;
  d.shared_per_block_optin = prop.sharedMemPerBlockOptin;
  d.memory_bus_bits = prop.memoryBusWidth;
  int khz = 0;
  GPULAB_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, index));
  d.max_sm_clock_mhz = khz / 1000;
  GPULAB_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, index));
  d.max_mem_clock_mhz = khz / 1000;

  int previous = 0;
  GPULAB_CHECK(cudaGetDevice(&previous));
  GPULAB_CHECK(cudaSetDevice(index));
  size_t free_bytes = 0, total_bytes = 0;
  GPULAB_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  GPULAB_CHECK(cudaSetDevice(previous));
  d.memory_total = total_bytes;
  d.memory_free = free_bytes;

  int count = 0;
  GPULAB_CHECK(cudaGetDeviceCount(&count));
  for (int peer = 0; peer < count; ++peer) {
    int can = 0;
    if (peer != index && cudaDeviceCanAccessPeer(&can, index, peer) == cudaSuccess && can)
      d.peers.push_back(peer);
  }

  auto& nvml = Nvml::get();
  // NVML wants the bus id with an 8-digit domain; CUDA gives 4 or 8 digits.
  std::string id = d.pci_bus_id;
  if (id.size() == 12) id = "0000" + id;
  d.sm_clock_mhz = nvml.sm_clock_mhz(id);
  d.mem_clock_mhz = nvml.mem_clock_mhz(id);
  if (auto v = nvml.max_sm_clock_mhz(id)) d.max_sm_clock_mhz = static_cast<int>(*v);
  if (auto v = nvml.max_mem_clock_mhz(id)) d.max_mem_clock_mhz = static_cast<int>(*v);
  d.mig_enabled = nvml.mig_enabled(id);
  if (d.mig_enabled.value_or(false))
    if (auto inst = nvml.mig_instances(id)) d.mig_instances = *inst;
  if (auto links = nvml.nvlink_active(id)) d.nvlink_active = *links;
  d.pcie_generation = nvml.pcie_generation(id);
  d.pcie_width = nvml.pcie_width(id);
  d.power_limit_watts = nvml.power_limit_watts(id);
  return d;
}

std::vector<DeviceInfo> query_devices() {
  const int count = require_devices();
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) out.push_back(query_device(i));
  return out;
}

SoftwareVersions query_versions() {
  SoftwareVersions v;
  cudaDriverGetVersion(&v.cuda_driver);
  cudaRuntimeGetVersion(&v.cuda_runtime);
  v.cublas = static_cast<int>(cublasLtGetVersion());
  v.cudnn = static_cast<int>(cudnnGetVersion());
  ncclGetVersion(&v.nccl);
  auto& nvml = Nvml::get();
  if (auto text = nvml.driver_version())
    v.driver = *text;
  else if (v.cuda_driver > 0)
    v.driver = "CUDA " + format_cuda_version(v.cuda_driver);
  return v;
}

HostInfo query_host() {
  HostInfo h;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0) h.hostname = name;
  h.cpu_cores = std::thread::hardware_concurrency();
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      h.cpu_model = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    if (key == "MemTotal:") {
      uint64_t kb = 0;
      meminfo >> kb;
      h.memory_total = kb * 1024;
      break;
    }
  }
  std::ifstream os_release("/etc/os-release");
  for (std::string line; std::getline(os_release, line);) {
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      h.os = line.substr(12);
      if (h.os.size() >= 2 && h.os.front() == '"') h.os = h.os.substr(1, h.os.size() - 2);
    }
  }
  return h;
}

std::string format_cuda_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string format_library_version(int v) {
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}

json to_json(const DeviceInfo& d) {
  json j = {{"index", d.index},
            {"name", d.name},
            {"pci_bus_id", d.pci_bus_id},
            {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
            {"sm_count", d.sm_count},
            {"memory_total_bytes", d.memory_total},
            {"memory_free_bytes", d.memory_free},
            {"l2_bytes", d.l2_bytes},
            {"shared_memory_per_sm_bytes", d.shared_per_sm},
            {"shared_memory_per_block_optin_bytes", d.shared_per_block_optin},
            {"memory_bus_bits", d.memory_bus_bits},
            {"max_sm_clock_mhz", d.max_sm_clock_mhz},
            {"max_mem_clock_mhz", d.max_mem_clock_mhz},
            {"nvlink_links_active", std::count(d.nvlink_active.begin(), d.nvlink_active.end(), true)},
            {"nvlink_links", d.nvlink_active.size()},
            {"peers", d.peers}};
  auto opt = [&j](const char* key, const auto& v) { j[key] = v ? json(*v) : json(nullptr); };
  opt("sm_clock_mhz", d.sm_clock_mhz);
  opt("mem_clock_mhz", d.mem_clock_mhz);
  opt("mig_enabled", d.mig_enabled);
  opt("pcie_generation", d.pcie_generation);
  opt("pcie_width", d.pcie_width);
  opt("power_limit_watts", d.power_limit_watts);
  j["mig_instances"] = json::array();
  for (const auto& m : d.mig_instances)
    j["mig_instances"].push_back({{"index", m.index}, {"uuid", m.uuid}, {"name", m.name}, {"memory_total_bytes", m.memory_total}});
  return j;
}

json to_json(const SoftwareVersions& v) {
  return {{"driver", v.driver},
          {"cuda_driver", format_cuda_version(v.cuda_driver)},
          {"cuda_runtime", format_cuda_version(v.cuda_runtime)},
          {"cublas", format_library_version(v.cublas)},
          {"cudnn", format_library_version(v.cudnn)},
          {"nccl", format_library_version(v.nccl)}};
}

json to_json(const HostInfo& h) {
  return {{"hostname", h.hostname}, {"os", h.os}, {"cpu_model", h.cpu_model},
          {"cpu_cores", h.cpu_cores}, {"memory_total_bytes", h.memory_total}};
}

}  // namespace gpulab::core
