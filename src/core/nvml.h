// NVML loaded at run time (dlopen "libnvidia-ml.so.1"), so gpulab runs where the driver's
// management library is absent. Only the handful of calls gpulab uses are bound; each method
// returns std::nullopt when NVML or the query is unavailable.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace gpulab::core {

struct NvmlMigInstance {
  unsigned index;
  std::string uuid;
  std::string name;
  unsigned long long memory_total;
};

struct NvmlUtilization {
  unsigned gpu_percent;
  unsigned memory_percent;
};

class Nvml {
 public:
  // The process-wide instance; loads and initialises NVML on first use.
  static Nvml& get();
  bool available() const { return handle_ != nullptr; }
  const std::string& unavailable_reason() const { return reason_; }

  std::optional<std::string> driver_version();
  // Device queries by PCI bus id ("0000:19:00.0"), as cudaDeviceGetPCIBusId gives it.
  std::optional<unsigned> sm_clock_mhz(const std::string& bus_id);
  std::optional<unsigned> mem_clock_mhz(const std::string& bus_id);
  std::optional<unsigned> max_sm_clock_mhz(const std::string& bus_id);
  std::optional<unsigned> max_mem_clock_mhz(const std::string& bus_id);
  std::optional<bool> mig_enabled(const std::string& bus_id);
  std::optional<std::vector<NvmlMigInstance>> mig_instances(const std::string& bus_id);
  std::optional<std::vector<bool>> nvlink_active(const std::string& bus_id);  // per link
  std::optional<unsigned> pcie_generation(const std::string& bus_id);
  std::optional<unsigned> pcie_width(const std::string& bus_id);
  std::optional<double> power_watts(const std::string& bus_id);
  std::optional<double> power_limit_watts(const std::string& bus_id);
  std::optional<unsigned> temperature_c(const std::string& bus_id);
  // Why the clocks are below their maximum now: NVML's clocks event reasons mask (the gpu_sampler.h
  // constants name the ones gpulab reports).
  std::optional<unsigned long long> clock_event_reasons(const std::string& bus_id);
  std::optional<NvmlUtilization> utilization(const std::string& bus_id);
  // PCIe throughput over the last ~20 ms, KB/s.
  std::optional<unsigned> pcie_tx_kbps(const std::string& bus_id);
  std::optional<unsigned> pcie_rx_kbps(const std::string& bus_id);

  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

 private:
  Nvml();
  ~Nvml();
  void* device(const std::string& bus_id);
  void* symbol(const char* name);
  void* handle_ = nullptr;
  std::string reason_;
};

}  // namespace gpulab::core
