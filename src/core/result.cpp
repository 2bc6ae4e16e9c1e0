#include "core/result.h"

#include <ctime>

#include "core/device.h"
#include "core/safetensors.h"
#include "core/version.h"

namespace gpulab::core {

using nlohmann::json;

const char* git_revision() { return kGitRevision; }

std::string utc_timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

GpuStamp stamp_gpu(int index) {
  GpuStamp s;
  if (!why_no_device().empty()) return s;
  const DeviceInfo d = query_device(index);
  s.name = d.name;
  s.sm_clock_mhz = d.sm_clock_mhz;
  s.mem_clock_mhz = d.mem_clock_mhz;
  s.driver = query_versions().driver;
  return s;
}

json to_json(const Result& r, const GpuStamp& gpu) {
  json j = {{"schema", kResultSchema}, {"suite", r.suite},   {"name", r.name},
            {"metric", r.metric},      {"value", r.value},   {"unit", r.unit},
            {"params", r.params.is_null() ? json::object() : r.params},      {"git", git_revision()}, {"time", utc_timestamp()}};
  j["peak"] = r.peak ? json(*r.peak) : json(nullptr);
  j["fraction"] = r.peak && *r.peak > 0 ? json(r.value / *r.peak) : json(nullptr);
  j["gpu"] = {{"name", gpu.name},
              {"sm_clock", gpu.sm_clock_mhz ? json(*gpu.sm_clock_mhz) : json(nullptr)},
              {"mem_clock", gpu.mem_clock_mhz ? json(*gpu.mem_clock_mhz) : json(nullptr)},
              {"driver", gpu.driver}};
  return j;
}

void ResultLog::write(const std::filesystem::path& path) const {
  write_file_atomic(path, results_.dump(2) + "\n");
}

std::string validate_result(const json& j) {
  if (!j.is_object()) return "not an object";
  if (j.value("schema", 0) != kResultSchema) return "schema is not " + std::to_string(kResultSchema);
  for (const char* key : {"suite", "name", "metric", "unit", "git", "time"})
    if (!j.contains(key) || !j[key].is_string()) return std::string("\"") + key + "\" is not a string";
  if (!j.contains("value") || !j["value"].is_number()) return "\"value\" is not a number";
  for (const char* key : {"peak", "fraction"})
    if (!j.contains(key) || !(j[key].is_number() || j[key].is_null()))
      return std::string("\"") + key + "\" is neither a number nor null";
  if (!j.contains("params") || !j["params"].is_object()) return "\"params\" is not an object";
  if (!j.contains("gpu") || !j["gpu"].is_object()) return "\"gpu\" is not an object";
  for (const char* key : {"name", "sm_clock", "mem_clock", "driver"})
    if (!j["gpu"].contains(key)) return std::string("\"gpu\" lacks \"") + key + "\"";
  return "";
}

}  // namespace gpulab::core
