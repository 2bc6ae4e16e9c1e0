// A GPU's clock and power, read by a background thread while work runs, so that a figure can say
// what clock it ran at and why that was below the maximum. On the H200 a 70B fp8 decode at batch
// 16 holds the board at its 700 W limit and the SM clock 10-27 % below its 1980 MHz (session 25):
// the step time then depends on the energy the kernels spend, not on HBM alone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gpulab::core {

// One reading; a field NVML could not give is empty.
struct GpuReading {
  std::optional<unsigned> sm_clock_mhz;
  std::optional<double> power_w;
  std::optional<unsigned> temperature_c;
  std::optional<unsigned long long> clock_event_reasons;  // Nvml::clock_event_reasons' mask
};

// NVML's clocks event reasons (nvml.h, nvmlClocksEventReason*) that the summary names.
constexpr unsigned long long kClocksSoftwarePowerCap = 0x4;
constexpr unsigned long long kClocksHardwareSlowdown = 0x8;  // also raised by the power brake below
constexpr unsigned long long kClocksSoftwareThermal = 0x20;
constexpr unsigned long long kClocksHardwareThermal = 0x40;
constexpr unsigned long long kClocksHardwarePowerBrake = 0x80;

// Reads `read` every `period` on its own thread from construction until stop() (or destruction).
class GpuSampler {
 public:
  using Read = std::function<GpuReading()>;
  GpuSampler(Read read, std::chrono::milliseconds period);
  ~GpuSampler();
  // Ends the sampling (one last reading first) and returns every reading, oldest first.
  std::vector<GpuReading> stop();

  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

 private:
  Read read_;
  std::chrono::milliseconds period_;
  std::vector<GpuReading> readings_;
  std::mutex mutex_;  // guards readings_ and stopping_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

// The NVML readings of the GPU at bus_id (cudaDeviceGetPCIBusId's form); every field empty where
// NVML is missing.
GpuSampler::Read nvml_reader(const std::string& bus_id);

struct ClockSummary {
  size_t samples = 0;  // readings with an SM clock
  double sm_clock_mhz_median = 0, sm_clock_mhz_min = 0, sm_clock_mhz_max = 0;
  std::optional<double> power_w_median;
  // Shares of the readings with a reason mask whose mask holds the software power cap, or a
  // thermal slowdown (software or hardware), or the hardware power brake.
  double power_cap_share = 0, thermal_share = 0, power_brake_share = 0;
};

// Empty when no reading has an SM clock.
std::optional<ClockSummary> summarize_clocks(const std::vector<GpuReading>& readings);

}  // namespace gpulab::core
