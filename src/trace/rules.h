// The diagnosis rules: a Trace goes in, findings ranked by estimated time lost come out.
//
// Idle GPU time is cut into gaps (no kernel, copy or memset on any device). Each gap is explained
// by at most one cause rule: host_starved / um_thrashing (the host was busy elsewhere before
// issuing the next launch), sync_api / sync_memcpy / sync_memset (a blocking call drained the
// GPU), launch_bound (short work separated by launch-overhead gaps). The symptom rules
// low_gpu_utilization and gpu_idle_gaps report the idle time no cause rule explains, so a cause
// outranks its symptom. pageable_memcpy, pcie_saturation and low_occupancy measure busy time that
// could be shorter. Thresholds and their meaning are listed in docs/diagnose.md.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trace/trace.h"

namespace gpulab::trace {

enum class Severity { low, medium, high };
std::string_view severity_name(Severity s);

struct Finding {
  std::string rule;
  Severity severity = Severity::low;
  double time_lost_ms = 0;
  std::string summary;      // one line: what was seen
  nlohmann::json evidence;  // numbers, time ranges (ms from trace start), top offenders
  std::string fix;
};

struct Report {
  std::vector<Finding> findings;  // ranked by time_lost_ms, largest first
  nlohmann::json summary;         // span, busy time, record counts, dropped records
};

// Named numeric thresholds "rule.key" with documented defaults; unknown keys are an InputError.
class Thresholds {
 public:
  Thresholds();
  double get(const std::string& key) const;
  void set(const std::string& key, double value);
  // Parses "rule.key=value" as given to --threshold.
  void set_from_text(const std::string& assignment);
  const std::map<std::string, double>& values() const { return values_; }

 private:
  std::map<std::string, double> values_;
};

// The rule ids, in the order they are documented.
const std::vector<std::string>& rule_ids();

Report analyze(const Trace& trace, const Thresholds& thresholds = Thresholds());

nlohmann::json report_json(const Report& report);

}  // namespace gpulab::trace
