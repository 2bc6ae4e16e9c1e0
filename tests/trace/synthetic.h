// Builds synthetic traces for the rule tests: a host thread issuing launches and copies, the
// GPU running them. Times are given in microseconds.
#pragma once

#include <algorithm>
#include <string>

#include "trace/rules.h"
#include "trace/trace.h"

namespace gpulab::trace::testing {

inline int64_t us(double v) { return int64_t(v * 1000); }

struct Synthetic {
  Trace t;
  int64_t next_correlation = 1;

  Synthetic() { t.devices[0] = DeviceInfo{"H200", 132, 5, 16}; }

  int64_t api(const std::string& name, double start_us, double end_us, int64_t correlation = 0) {
    ApiCall c;
    c.name = name;
    c.start_ns = us(start_us);
    c.end_ns = us(end_us);
    c.thread = 1;
    c.correlation = correlation ? correlation : next_correlation++;
    t.api_calls.push_back(c);
    return c.correlation;
  }
  // A cudaLaunchKernel call of 3 us at `launch_us` and its kernel.
  Kernel& kernel(double launch_us, double start_us, double dur_us, int blocks = 264,
                 const std::string& name = "work_kernel", int64_t stream = 7) {
    Kernel k;
    k.name = name;
    k.correlation = api("cudaLaunchKernel", launch_us, launch_us + 3);
    k.start_ns = us(start_us);
    k.end_ns = us(start_us + dur_us);
    k.stream = stream;
    k.grid = {blocks, 1, 1};
    k.block = {256, 1, 1};
    t.kernels.push_back(k);
    return t.kernels.back();
  }
  Memcpy& copy(const std::string& api_name, double api_start_us, double api_end_us, double start_us, double dur_us,
               CopyKind kind, MemoryKind src, MemoryKind dst, int64_t bytes, int64_t stream = 7) {
    Memcpy m;
    m.correlation = api(api_name, api_start_us, api_end_us);
    m.start_ns = us(start_us);
    m.end_ns = us(start_us + dur_us);
    m.kind = kind;
    m.src = src;
    m.dst = dst;
    m.bytes = bytes;
    m.stream = stream;
    t.memcpys.push_back(m);
    return t.memcpys.back();
  }
  void um(UmKind kind, double start_us, double dur_us, uint64_t address, int64_t value) {
    t.um_events.push_back(UmEvent{kind, us(start_us), us(start_us + dur_us), address, value, 0});
  }
};

inline const Finding* find_rule(const Report& r, const std::string& rule) {
  const auto it = std::find_if(r.findings.begin(), r.findings.end(), [&](const Finding& f) { return f.rule == rule; });
  return it == r.findings.end() ? nullptr : &*it;
}

inline std::string rules_text(const Report& r) {
  std::string s;
  for (const auto& f : r.findings) s += f.rule + "(" + std::to_string(f.time_lost_ms) + " ms) ";
  return s;
}

}  // namespace gpulab::trace::testing
