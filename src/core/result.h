// Measured figures in the one JSON schema of DESIGN.md:
//   {"schema": 1, "suite", "name", "metric", "value", "unit", "peak", "fraction",
//    "params": {...}, "gpu": {name, sm_clock, mem_clock, driver}, "git", "time"}
// one object per figure, an array per run.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpulab::core {

constexpr int kResultSchema = 1;

struct GpuStamp {
  std::string name;
  std::optional<unsigned> sm_clock_mhz;
  std::optional<unsigned> mem_clock_mhz;
  std::string driver;
};

struct Result {
  std::string suite;   // "gemm"
  std::string name;    // "cublaslt_bf16_8192"
  std::string metric;  // "throughput"
  double value = 0;
  std::string unit;    // "TFLOP/s"
  std::optional<double> peak;  // datasheet peak in the same unit, when one exists
  nlohmann::json params = nlohmann::json::object();
};

// The build's git revision ("unknown" outside a checkout).
const char* git_revision();
// Current time as ISO 8601 UTC ("2026-11-29T16:14:07Z").
std::string utc_timestamp();
// Clocks and driver of device `index` right now (empty name when no device).
GpuStamp stamp_gpu(int index);

nlohmann::json to_json(const Result& r, const GpuStamp& gpu);

// Collects results of one run and writes them as a JSON array (atomically).
class ResultLog {
 public:
  explicit ResultLog(GpuStamp gpu) : gpu_(std::move(gpu)) {}
  void add(const Result& r) { results_.push_back(to_json(r, gpu_)); }
  const nlohmann::json& results() const { return results_; }
  void write(const std::filesystem::path& path) const;

 private:
  GpuStamp gpu_;
  nlohmann::json results_ = nlohmann::json::array();
};

// Checks that `j` is one result object of the schema; returns "" or what is wrong.
std::string validate_result(const nlohmann::json& j);

}  // namespace gpulab::core
