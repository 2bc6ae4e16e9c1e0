#include "core/gpu_sampler.h"

#include <algorithm>

#include "core/nvml.h"

namespace gpulab::core {

namespace {
double median(std::vector<double> v) {
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2) return *mid;
  return (*mid + *std::max_element(v.begin(), mid)) / 2;
}
}  // namespace

GpuSampler::GpuSampler(Read read, std::chrono::milliseconds period) : read_(std::move(read)), period_(period) {
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      GpuReading r = read_();
      lock.lock();
      readings_.push_back(std::move(r));
      wake_.wait_for(lock, period_, [this] { return stopping_; });
    }
  });
}

GpuSampler::~GpuSampler() { stop(); }

std::vector<GpuReading> GpuSampler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
    readings_.push_back(read_());  // the state at the end of the work, however short it was
  }
  std::lock_guard lock(mutex_);
  return readings_;
}

GpuSampler::Read nvml_reader(const std::string& bus_id) {
  return [bus_id] {
    Nvml& nvml = Nvml::get();
    if (!nvml.available()) return GpuReading{};
    return GpuReading{nvml.sm_clock_mhz(bus_id), nvml.power_watts(bus_id), nvml.temperature_c(bus_id),
                      nvml.clock_event_reasons(bus_id)};
  };
}

std::optional<ClockSummary> summarize_clocks(const std::vector<GpuReading>& readings) {
  std::vector<double> clocks, watts;
  size_t with_reasons = 0, capped = 0, thermal = 0, brake = 0;
  for (const GpuReading& r : readings) {
    if (r.sm_clock_mhz) clocks.push_back(*r.sm_clock_mhz);
    if (r.power_w) watts.push_back(*r.power_w);
    if (!r.clock_event_reasons) continue;
    const unsigned long long mask = *r.clock_event_reasons;
    ++with_reasons;
    capped += (mask & kClocksSoftwarePowerCap) != 0;
    thermal += (mask & (kClocksSoftwareThermal | kClocksHardwareThermal)) != 0;
    brake += (mask & kClocksHardwarePowerBrake) != 0;
  }
  if (clocks.empty()) return std::nullopt;
  ClockSummary s;
  s.samples = clocks.size();
  s.sm_clock_mhz_median = median(clocks);
  s.sm_clock_mhz_min = *std::min_element(clocks.begin(), clocks.end());
  s.sm_clock_mhz_max = *std::max_element(clocks.begin(), clocks.end());
  if (!watts.empty()) s.power_w_median = median(watts);
  if (with_reasons) {
    const double n = static_cast<double>(with_reasons);
    s.power_cap_share = capped / n;
    s.thermal_share = thermal / n;
    s.power_brake_share = brake / n;
  }
  return s;
}

}  // namespace gpulab::core
