// What this machine has: CUDA devices (properties, clocks, memory, PCI, MIG, NVLink), the
// software stack's versions, and host facts for when no device is visible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/nvml.h"

namespace gpulab::core {

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string pci_bus_id;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  uint64_t memory_total = 0;  // bytes
  uint64_t memory_free = 0;
  uint64_t l2_bytes = 0;
  uint64_t shared_per_sm = 0;
  uint64_t shared_per_block_optin = 0;
  int memory_bus_bits = 0;
  int max_sm_clock_mhz = 0;   // from the runtime when NVML is absent
  int max_mem_clock_mhz = 0;
  std::optional<unsigned> sm_clock_mhz;  // current, from NVML
  std::optional<unsigned> mem_clock_mhz;
  std::optional<bool> mig_enabled;
  std::vector<NvmlMigInstance> mig_instances;
  std::vector<bool> nvlink_active;  // empty: no NVLink or unknown
  std::optional<unsigned> pcie_generation, pcie_width;
  std::optional<double> power_limit_watts;
  std::vector<int> peers;  // devices this one can access directly
};

struct SoftwareVersions {
  std::string driver;   // NVML's driver string ("580.159.03") or the CUDA driver API version
  int cuda_driver = 0;  // e.g. 13000
  int cuda_runtime = 0;
  int cublas = 0;
  int cudnn = 0;
  int nccl = 0;
};

struct HostInfo {
  std::string hostname;
  std::string os;
  std::string cpu_model;
  unsigned cpu_cores = 0;
  uint64_t memory_total = 0;
};

// Number of visible CUDA devices; throws NoDeviceError saying why when there is none.
int require_devices();
// Why no device is visible ("" when one is): no driver, no device, driver too old.
std::string why_no_device();

DeviceInfo query_device(int index);
// The device's PCI bus id, the key NVML's queries take ("0000:19:00.0").
std::string pci_bus_id(int index);
std::vector<DeviceInfo> query_devices();
SoftwareVersions query_versions();
HostInfo query_host();

// Formats a CUDA-style version integer (13000 -> "13.0", 90300 -> "9.3.0" for cuDNN).
std::string format_cuda_version(int v);
std::string format_library_version(int v);  // major*10000 + minor*100 + patch (cuDNN 9, NCCL)

nlohmann::json to_json(const DeviceInfo& d);
nlohmann::json to_json(const SoftwareVersions& v);
nlohmann::json to_json(const HostInfo& h);

}  // namespace gpulab::core
