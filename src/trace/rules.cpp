#include "trace/rules.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace gpulab::trace {

using nlohmann::json;

namespace {

// A threshold's default and the most it may be set to. Every threshold is a non-negative amount;
// the bounds keep the rules' conversions exact (a microsecond threshold becomes int64 nanoseconds)
// and their loops short (one per chunk).
struct ThresholdSpec {
  // Implicit, so that a table row reads {key, default}.
  ThresholdSpec(double value, double most = 1e9) : value(value), most(most) {}
  double value, most;
};

// key, default (, most). Documented in docs/diagnose.md; keep both in step.
const std::map<std::string, ThresholdSpec> kDefaults = {
    {"report.min_share", 0.01},        // drop findings losing less than this share of the span
    {"severity.high", 0.20},           // time lost / span at or above: high
    {"severity.medium", 0.05},         // ... medium; below: low
    {"low_gpu_utilization.chunks", {30, 1e4}},
    {"low_gpu_utilization.busy_percent", 50},
    {"gpu_idle_gaps.min_ms", 500},
    {"launch_bound.short_us", 20},     // a kernel/copy shorter than this is "short"
    {"launch_bound.max_gap_us", 100},  // gaps up to this size are launch overhead
    {"launch_bound.min_count", 50},    // short activities needed before the rule speaks
    {"host_starved.min_host_us", 50},  // host time outside CUDA calls that counts as host work
    {"pageable_memcpy.pinned_gbps", 0},  // expected pinned bandwidth; 0 = from trace / link
    {"sync_api.min_count", 1},
    {"sync_memcpy.min_count", 1},
    {"sync_memset.min_count", 1},
    {"um_thrashing.min_remigration", 1.5},  // bytes migrated / distinct bytes
    {"pcie_saturation.min_fraction", 0.6},  // of the link ceiling
    {"pcie_saturation.link_gbps", 0},       // 0 = from device info or best observed copy
    {"pcie_saturation.min_bytes", 1 << 20},
    {"low_occupancy.sm_count", 0},          // 0 = from device info
    {"low_occupancy.min_share", 0.2},       // of total kernel time
};

const std::map<std::string, std::string> kFixes = {
    {"low_gpu_utilization",
     "The GPU is idle for reasons no specific rule explains: look at the per-stream timeline "
     "(trace.json in Perfetto) around the flagged ranges; overlap independent work on streams."},
    {"gpu_idle_gaps",
     "Find what the host does during the long gaps (I/O, checkpointing, evaluation, Python); move it "
     "off the critical path or run it asynchronously."},
    {"launch_bound",
     "Launch overhead dominates: capture the loop in a CUDA graph, fuse small kernels, or raise the "
     "batch size so each kernel does more work."},
    {"host_starved",
     "The host is late issuing work: move preprocessing to the GPU (or to worker threads / a data "
     "loader), and queue work ahead so the GPU always has the next launch."},
    {"pageable_memcpy",
     "Copies touching pageable host memory are staged and synchronous: allocate the host buffers "
     "pinned (cudaMallocHost / cudaHostRegister, pin_memory=True) and use cudaMemcpyAsync."},
    {"sync_memcpy",
     "Synchronous copies drain the GPU: use cudaMemcpyAsync on a stream with pinned memory and "
     "synchronize only when the host needs the data."},
    {"sync_memset",
     "Synchronous memsets drain the GPU: use cudaMemsetAsync on the working stream."},
    {"sync_api",
     "Device/stream synchronizations on the critical path drain the GPU: remove them, replace with "
     "events (cudaStreamWaitEvent) between streams, or synchronize once per batch."},
    {"um_thrashing",
     "Managed pages migrate back and forth between host and device: prefetch them "
     "(cudaMemPrefetchAsync), set cudaMemAdvise (ReadMostly / PreferredLocation), or keep the data "
     "where it is used."},
    {"pcie_saturation",
     "Host-device transfers run at the link's ceiling while kernels wait: overlap copies with "
     "compute on separate streams, keep data resident on the GPU, compress or shrink transfers."},
    {"low_occupancy",
     "Grids with fewer blocks than SMs leave SMs idle: use more, smaller blocks (split the work, "
     "split-K), batch independent kernels, or run them concurrently on streams."},
};

constexpr double kNsPerMs = 1e6;

struct Interval {
  int64_t start, end;
  int64_t length() const { return end - start; }
};

std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Interval> out;
  for (const auto& i : v) {
    if (i.end <= i.start) continue;
    if (!out.empty() && i.start <= out.back().end) out.back().end = std::max(out.back().end, i.end);
    else out.push_back(i);
  }
  return out;
}

// Total length of the intersection of two merged (sorted, disjoint) lists.
int64_t overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  int64_t total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].start, b[j].start), hi = std::min(a[i].end, b[j].end);
    if (hi > lo) total += hi - lo;
    (a[i].end < b[j].end) ? ++i : ++j;
  }
  return total;
}

int64_t total_length(const std::vector<Interval>& v) {
  int64_t t = 0;
  for (const auto& i : v) t += i.length();
  return t;
}

enum class Blocking { none, sync_api, sync_memcpy, sync_memset };

Blocking blocking_kind(const std::string& name) {
  const bool async = name.find("Async") != std::string::npos;
  if (name.find("Synchronize") != std::string::npos) return Blocking::sync_api;
  const auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if ((starts("cudaMemcpy") || starts("cuMemcpy")) && !async) return Blocking::sync_memcpy;
  if ((starts("cudaMemset") || starts("cuMemset")) && !async) return Blocking::sync_memset;
  return Blocking::none;
}

const char* blocking_rule(Blocking b) {
  switch (b) {
    case Blocking::sync_api: return "sync_api";
    case Blocking::sync_memcpy: return "sync_memcpy";
    case Blocking::sync_memset: return "sync_memset";
    default: return "";
  }
}

// Names with counts and total time, largest first, at most `limit`.
struct Offenders {
  std::map<std::string, std::pair<int64_t, int64_t>> by_name;  // count, ns
  void add(const std::string& name, int64_t ns) {
    auto& e = by_name[name];
    e.first++;
    e.second += ns;
  }
  json top(size_t limit = 5) const {
    std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> v(by_name.begin(), by_name.end());
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.second > b.second.second; });
    json out = json::array();
    for (size_t i = 0; i < v.size() && i < limit; ++i)
      out.push_back({{"name", v[i].first}, {"count", v[i].second.first},
                     {"total_ms", v[i].second.second / kNsPerMs}});
    return out;
  }
};

double round3(double v) { return std::round(v * 1000) / 1000; }

// Everything the rules share: GPU activity, idle gaps, API lookups.
class Analyzer {
 public:
  Analyzer(const Trace& t, const Thresholds& th) : t_(t), th_(th) { index(); }
  Report run();

 private:
  struct Activity {
    int64_t start, end, correlation;
  };
  struct Gap {
    int64_t start, end;
    int64_t last_work_start;  // start of the work whose end opened the gap
    const Activity* next;
  };
  struct Attributed {
    Interval span;
    std::string rule;
  };

  void index();
  const ApiCall* top_level_call(const ApiCall* call) const;
  Blocking blocking(const ApiCall& call) const;
  const ApiCall* previous_top_level_call(const ApiCall& call) const;
  const ApiCall* blocking_call_before(const ApiCall* launch, const Gap& g) const;
  bool um_host_activity(const Interval& window) const;
  int64_t api_time(int64_t thread, const Interval& w) const;
  void attribute_gaps();
  void add_finding(const std::string& rule, double lost_ns, std::string summary, json evidence);
  json top_kernels(size_t limit) const;
  json range_ms(const Interval& i) const {
    return json::array({round3((i.start - span_.start) / kNsPerMs), round3((i.end - span_.start) / kNsPerMs)});
  }
  double ms(int64_t ns) const { return round3(ns / kNsPerMs); }

  void rule_attributed();
  void rule_symptoms();
  void rule_pageable();
  void rule_pcie();
  void rule_occupancy();
  void check_um();

  const Trace& t_;
  const Thresholds& th_;
  std::vector<Activity> activities_;  // sorted by start
  std::vector<Interval> busy_, kernel_busy_;
  Interval span_{0, 0};
  std::vector<Gap> gaps_;
  std::unordered_map<int64_t, const ApiCall*> by_correlation_;
  std::unordered_set<int64_t> to_pageable_;  // correlation ids of device-to-pageable copies
  std::unordered_set<int64_t> to_host_;      // correlation ids of device-to-host copies
  std::map<int64_t, std::vector<const ApiCall*>> top_calls_;  // per thread, sorted by start
  std::vector<Interval> um_migrations_;
  std::vector<int64_t> um_host_times_;  // CPU faults and DtoH migration starts, sorted
  bool um_pingpong_ = false;
  json um_evidence_;
  std::vector<Attributed> attributed_;
  std::vector<Finding> findings_;
};

void Analyzer::index() {
  for (const auto& k : t_.kernels) activities_.push_back({k.start_ns, k.end_ns, k.correlation});
  for (const auto& m : t_.memcpys) activities_.push_back({m.start_ns, m.end_ns, m.correlation});
  for (const auto& m : t_.memsets) activities_.push_back({m.start_ns, m.end_ns, m.correlation});
  std::sort(activities_.begin(), activities_.end(), [](auto& a, auto& b) { return a.start < b.start; });
  std::vector<Interval> all, kernels;
  for (const auto& a : activities_) all.push_back({a.start, a.end});
  for (const auto& k : t_.kernels) kernels.push_back({k.start_ns, k.end_ns});
  busy_ = merged(all);
  kernel_busy_ = merged(kernels);
  if (!activities_.empty()) {
    span_.start = activities_.front().start;
    for (const auto& a : activities_) span_.end = std::max(span_.end, a.end);
  }
  // The gap before each busy interval, paired with the activity that ends it.
  std::vector<int64_t> last_start(busy_.size(), 0);
  for (const auto& act : activities_) {
    const auto it = std::upper_bound(busy_.begin(), busy_.end(), act.start,
                                     [](int64_t t, const Interval& b) { return t < b.start; });
    if (it == busy_.begin()) continue;
    const size_t i = size_t(std::prev(it) - busy_.begin());
    if (act.end == busy_[i].end) last_start[i] = std::max(last_start[i], act.start);
  }
  size_t a = 0;
  for (size_t i = 1; i < busy_.size(); ++i) {
    while (a < activities_.size() && activities_[a].start < busy_[i].start) ++a;
    gaps_.push_back(
        {busy_[i - 1].end, busy_[i].start, last_start[i - 1], a < activities_.size() ? &activities_[a] : nullptr});
  }

  for (const auto& m : t_.memcpys) {
    if (m.dst == MemoryKind::pageable && m.correlation != 0) to_pageable_.insert(m.correlation);
    if (m.kind == CopyKind::dtoh && m.correlation != 0) to_host_.insert(m.correlation);
  }
  for (const auto& c : t_.api_calls)
    if (c.correlation != 0) {
      // Runtime calls win over driver calls sharing an id (they issue the work users wrote).
      auto [it, inserted] = by_correlation_.emplace(c.correlation, &c);
      if (!inserted && it->second->driver && !c.driver) it->second = &c;
    }
  std::map<int64_t, std::vector<const ApiCall*>> per_thread;
  for (const auto& c : t_.api_calls) per_thread[c.thread].push_back(&c);
  for (auto& [thread, calls] : per_thread) {
    std::sort(calls.begin(), calls.end(), [](auto* a, auto* b) {
      return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns > b->end_ns;
    });
    auto& top = top_calls_[thread];
    for (const ApiCall* c : calls)
      if (top.empty() || c->start_ns >= top.back()->end_ns) top.push_back(c);  // drop nested calls
  }
}

// A copy from the device into pageable memory returns only once the copy is done, "Async" or not
// (CUDA's API sync behaviour). A synchronize issued right after a device-to-host copy (the
// thread's previous call) waits for that copy: a synchronous copy in two calls, as PyTorch's
// .item() and .cpu() make them (cudaMemcpyAsync into pinned memory, cudaStreamSynchronize).
Blocking Analyzer::blocking(const ApiCall& call) const {
  const Blocking b = blocking_kind(call.name);
  if (b == Blocking::none && call.correlation != 0 && to_pageable_.count(call.correlation)) return Blocking::sync_memcpy;
  if (b == Blocking::sync_api) {
    const ApiCall* prev = previous_top_level_call(call);
    if (prev && prev->correlation != 0 && to_host_.count(prev->correlation)) return Blocking::sync_memcpy;
  }
  return b;
}

const ApiCall* Analyzer::previous_top_level_call(const ApiCall& call) const {
  const auto it = top_calls_.find(call.thread);
  if (it == top_calls_.end()) return nullptr;
  const auto& top = it->second;
  auto pos = std::lower_bound(top.begin(), top.end(), call.start_ns,
                              [](const ApiCall* c, int64_t t) { return c->start_ns < t; });
  return pos == top.begin() ? nullptr : *std::prev(pos);
}

const ApiCall* Analyzer::top_level_call(const ApiCall* call) const {
  const auto it = top_calls_.find(call->thread);
  if (it == top_calls_.end()) return call;
  const auto& top = it->second;
  auto pos = std::upper_bound(top.begin(), top.end(), call->start_ns,
                              [](int64_t t, const ApiCall* c) { return t < c->start_ns; });
  if (pos == top.begin()) return call;
  return *std::prev(pos);
}

// The blocking call the host sat in as the GPU drained before gap `g`: the latest blocking
// top-level call on the launch's thread that began before the gap and was still waiting when the
// GPU's last work before it began. Calls made inside the gap (an error check, a quick synchronize
// of an already idle GPU) and non-blocking ones next to the wait are passed over.
const ApiCall* Analyzer::blocking_call_before(const ApiCall* launch, const Gap& g) const {
  const auto& calls = top_calls_.at(launch->thread);
  auto pos = std::lower_bound(calls.begin(), calls.end(), std::min(launch->start_ns, g.start),
                              [](const ApiCall* c, int64_t t) { return c->start_ns < t; });
  while (pos != calls.begin()) {
    const ApiCall* c = *--pos;
    if (c->end_ns <= g.last_work_start) break;  // and so did every earlier call
    if (blocking(*c) != Blocking::none) return c;
  }
  return nullptr;
}

// Time a thread spent inside CUDA API calls during `w`.
int64_t Analyzer::api_time(int64_t thread, const Interval& w) const {
  const auto it = top_calls_.find(thread);
  if (it == top_calls_.end()) return 0;
  const auto& calls = it->second;
  auto pos = std::lower_bound(calls.begin(), calls.end(), w.start,
                              [](const ApiCall* c, int64_t t) { return c->end_ns <= t; });
  int64_t total = 0;
  for (; pos != calls.end() && (*pos)->start_ns < w.end; ++pos)
    total += std::max<int64_t>(0, std::min((*pos)->end_ns, w.end) - std::max((*pos)->start_ns, w.start));
  return total;
}

bool Analyzer::um_host_activity(const Interval& w) const {
  auto it = std::lower_bound(um_host_times_.begin(), um_host_times_.end(), w.start);
  return it != um_host_times_.end() && *it < w.end;
}

// Decides, for every idle gap, which cause (if any) explains which part of it.
void Analyzer::attribute_gaps() {
  const int64_t min_host = int64_t(th_.get("host_starved.min_host_us") * 1000);
  const int64_t short_ns = int64_t(th_.get("launch_bound.short_us") * 1000);
  const int64_t max_gap = int64_t(th_.get("launch_bound.max_gap_us") * 1000);
  for (const Gap& g : gaps_) {
    if (!g.next) continue;
    const auto found = by_correlation_.find(g.next->correlation);
    if (found == by_correlation_.end()) continue;
    const ApiCall* launch = top_level_call(found->second);
    const ApiCall* prev = blocking_call_before(launch, g);
    const Blocking blocked = prev ? blocking(*prev) : Blocking::none;
    // That call explains the gap when the launch came straight after it returned (less than
    // min_host of host work in between). Not "returned after the gap began": the GPU-to-host clock
    // conversion can put the return a few microseconds before the end of the kernel it waited for.
    bool blocked_here = false;
    if (prev) {
      const Interval since{prev->end_ns, launch->start_ns};
      blocked_here = since.length() - api_time(launch->thread, since) < min_host;
    }
    const bool next_short = g.next->end - g.next->start < short_ns;
    const auto launch_tail = [&](int64_t from) {
      if (next_short && g.end - from <= max_gap) attributed_.push_back({{from, g.end}, "launch_bound"});
    };
    if (launch->start_ns > g.start) {
      // The launch came after the GPU ran dry: was the host busy with its own work meanwhile?
      const Interval window{g.start, std::min(launch->start_ns, g.end)};
      if (window.length() - api_time(launch->thread, window) >= min_host) {
        attributed_.push_back({window, um_pingpong_ && um_host_activity(window) ? "um_thrashing" : "host_starved"});
        if (launch->start_ns < g.end) launch_tail(launch->start_ns);
        continue;
      }
    }
    if (blocked_here) attributed_.push_back({{g.start, g.end}, blocking_rule(blocked)});
    else launch_tail(g.start);
  }
}

void Analyzer::add_finding(const std::string& rule, double lost_ns, std::string summary, json evidence) {
  const double span = double(std::max<int64_t>(span_.length(), 1));
  const double share = lost_ns / span;
  if (share < th_.get("report.min_share") || lost_ns <= 0) return;
  Finding f;
  f.rule = rule;
  f.severity = share >= th_.get("severity.high")     ? Severity::high
               : share >= th_.get("severity.medium") ? Severity::medium
                                                     : Severity::low;
  f.time_lost_ms = round3(lost_ns / kNsPerMs);
  f.summary = std::move(summary);
  evidence["share_of_span_percent"] = round3(100 * share);
  f.evidence = std::move(evidence);
  f.fix = kFixes.at(rule);
  findings_.push_back(std::move(f));
}

// Cause rules fed by gap attribution.
void Analyzer::rule_attributed() {
  std::map<std::string, std::vector<const Attributed*>> by_rule;
  for (const auto& a : attributed_) by_rule[a.rule].push_back(&a);

  if (auto it = by_rule.find("launch_bound"); it != by_rule.end()) {
    const int64_t short_ns = int64_t(th_.get("launch_bound.short_us") * 1000);
    Offenders names;
    int64_t short_count = 0, short_time = 0;
    for (const auto& k : t_.kernels)
      if (k.duration_ns() < short_ns) {
        ++short_count;
        short_time += k.duration_ns();
        names.add(k.name, k.duration_ns());
      }
    int64_t lost = 0;
    for (const auto* a : it->second) lost += a->span.length();
    const double mean_gap_us = lost / 1000.0 / double(it->second.size());
    if (short_count >= th_.get("launch_bound.min_count"))
      add_finding("launch_bound", double(lost),
                  std::to_string(short_count) + " short kernels separated by launch-overhead gaps (mean " +
                      std::to_string(int(std::lround(mean_gap_us))) + " us)",
                  {{"short_kernels", short_count},
                   {"short_kernel_time_ms", ms(short_time)},
                   {"gaps", it->second.size()},
                   {"mean_gap_us", round3(mean_gap_us)},
                   {"first_range_ms", range_ms(it->second.front()->span)},
                   {"last_range_ms", range_ms(it->second.back()->span)},
                   {"top_offenders", names.top()}});
  }

  if (auto it = by_rule.find("host_starved"); it != by_rule.end()) {
    int64_t lost = 0;
    const Attributed* longest = it->second.front();
    for (const auto* a : it->second) {
      lost += a->span.length();
      if (a->span.length() > longest->span.length()) longest = a;
    }
    add_finding("host_starved", double(lost),
                "GPU idle " + std::to_string(it->second.size()) +
                    " times while the host had not yet issued the next launch",
                {{"gaps", it->second.size()},
                 {"mean_gap_ms", ms(lost / int64_t(it->second.size()))},
                 {"longest_gap_ms", ms(longest->span.length())},
                 {"longest_range_ms", range_ms(longest->span)}});
  }

  for (const char* rule : {"sync_api", "sync_memcpy", "sync_memset"}) {
    auto it = by_rule.find(rule);
    if (it == by_rule.end()) continue;
    Offenders calls;
    int64_t host_blocked = 0;
    for (const auto& c : t_.api_calls)
      if (!c.driver && blocking_rule(blocking(c)) == std::string(rule)) {
        calls.add(c.name, c.end_ns - c.start_ns);
        host_blocked += c.end_ns - c.start_ns;
      }
    if (calls.by_name.empty())  // driver-only traces
      for (const auto& c : t_.api_calls)
        if (blocking_rule(blocking(c)) == std::string(rule)) calls.add(c.name, c.end_ns - c.start_ns);
    int64_t lost = 0;
    for (const auto* a : it->second) lost += a->span.length();
    int64_t n = 0;
    for (const auto& [name, e] : calls.by_name) n += e.first;
    if (n < th_.get(std::string(rule) + ".min_count")) continue;
    add_finding(rule, double(lost),
                std::to_string(it->second.size()) + " GPU idle gaps right after blocking calls (" +
                    std::to_string(n) + " calls)",
                {{"gaps_after_blocking_call", it->second.size()},
                 {"calls", n},
                 {"host_blocked_ms", ms(host_blocked)},
                 {"mean_gap_us", round3(lost / 1000.0 / double(it->second.size()))},
                 {"first_range_ms", range_ms(it->second.front()->span)},
                 {"top_calls", calls.top()}});
  }

  if (um_pingpong_) {
    int64_t host_windows = 0;
    if (auto it = by_rule.find("um_thrashing"); it != by_rule.end())
      for (const auto* a : it->second) host_windows += a->span.length();
    const int64_t in_gpu = overlap(um_migrations_, busy_);
    um_evidence_["host_fault_gaps_ms"] = ms(host_windows);
    um_evidence_["migration_during_gpu_work_ms"] = ms(in_gpu);
    add_finding("um_thrashing", double(host_windows + in_gpu),
                "managed memory migrates back and forth between host and device", um_evidence_);
  }
}

// Idle time that no cause explains: the Nsight-style symptom rules.
void Analyzer::rule_symptoms() {
  std::vector<Interval> explained;
  for (const auto& a : attributed_) explained.push_back(a.span);
  explained = merged(explained);
  std::vector<Interval> idle;
  for (const auto& g : gaps_) idle.push_back({g.start, g.end});
  idle = merged(idle);
  const auto unexplained = [&](const Interval& w) {
    std::vector<Interval> clipped;
    for (const auto& i : idle) {
      const Interval c{std::max(i.start, w.start), std::min(i.end, w.end)};
      if (c.end > c.start) clipped.push_back(c);
    }
    return total_length(clipped) - overlap(clipped, explained);
  };

  const int chunks = std::max(1, int(th_.get("low_gpu_utilization.chunks")));
  const double busy_limit = th_.get("low_gpu_utilization.busy_percent");
  if (span_.length() > 0) {
    int64_t lost = 0, flagged = 0;
    json ranges = json::array();
    double min_busy = 100;
    // Chunk c starts at length * c / chunks, computed without the product: a trace's times may
    // reach 2^62 ns, and length * c would overflow.
    const int64_t length = span_.length(), whole = length / chunks, rest = length % chunks;
    const auto boundary = [&](int c) { return span_.start + whole * c + rest * c / chunks; };
    for (int c = 0; c < chunks; ++c) {
      const Interval w{boundary(c), boundary(c + 1)};
      if (w.length() <= 0) continue;
      const double busy = 100.0 * double(overlap(busy_, {w})) / double(w.length());
      if (busy >= busy_limit) continue;
      ++flagged;
      min_busy = std::min(min_busy, busy);
      lost += unexplained(w);
      if (ranges.size() < 10) ranges.push_back(range_ms(w));
    }
    if (flagged > 0)
      add_finding("low_gpu_utilization", double(lost),
                  std::to_string(flagged) + " of " + std::to_string(chunks) + " time chunks are less than " +
                      std::to_string(int(busy_limit)) + "% busy",
                  {{"chunks", chunks}, {"flagged_chunks", flagged}, {"lowest_busy_percent", round3(min_busy)},
                   {"flagged_ranges_ms", ranges}, {"unexplained_idle_ms", ms(lost)}});
  }

  const int64_t min_gap = int64_t(th_.get("gpu_idle_gaps.min_ms") * kNsPerMs);
  int64_t lost = 0, count = 0, total = 0;
  json ranges = json::array();
  for (const auto& g : idle)
    if (g.length() >= min_gap) {
      ++count;
      total += g.length();
      lost += unexplained(g);
      if (ranges.size() < 10) ranges.push_back(range_ms(g));
    }
  if (count > 0)
    add_finding("gpu_idle_gaps", double(lost),
                std::to_string(count) + " idle gaps of at least " + std::to_string(int(th_.get("gpu_idle_gaps.min_ms"))) + " ms",
                {{"gaps", count}, {"total_gap_ms", ms(total)}, {"unexplained_ms", ms(lost)}, {"ranges_ms", ranges}});
}

// Best pinned bandwidth for copies of one direction, GB/s (0 when none qualifies).
double best_pinned_gbps(const Trace& t, CopyKind kind, int64_t min_bytes) {
  double best = 0;
  for (const auto& m : t.memcpys)
    if (m.kind == kind && m.src != MemoryKind::pageable && m.dst != MemoryKind::pageable &&
        m.bytes >= min_bytes && m.duration_ns() > 0)
      best = std::max(best, double(m.bytes) / double(m.duration_ns()));
  return best;
}

// The host link's one-direction bandwidth, GB/s, and where it comes from: the PCIe generation
// and width NVML reported, else assumed from the compute capability (PyTorch traces carry no link
// information; discrete GPUs of compute capability 9 and later use PCIe gen 5 x16, 8.x gen 4,
// 6.x-7.x gen 3), else 0.
struct Link {
  double gbps = 0;
  std::string source = "unknown";
};

Link host_link(const Trace& t) {
  Link best;
  for (const auto& [id, d] : t.devices)
    if (d.pcie_gbps() > best.gbps)
      best = {d.pcie_gbps(), "PCIe gen " + std::to_string(d.pcie_generation) + " x" + std::to_string(d.pcie_width)};
  if (best.gbps > 0) return best;
  for (const auto& [id, d] : t.devices) {
    const int gen = d.compute_major >= 9 ? 5 : d.compute_major == 8 ? 4 : d.compute_major >= 6 ? 3 : 0;
    const DeviceInfo assumed{"", 0, gen, 16};
    if (assumed.pcie_gbps() > best.gbps)
      best = {assumed.pcie_gbps(), "PCIe gen " + std::to_string(gen) + " x16 assumed from compute capability " +
                                       std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor)};
  }
  return best;
}

void Analyzer::rule_pageable() {
  const int64_t min_bytes = int64_t(th_.get("pcie_saturation.min_bytes"));
  const Link link = host_link(t_);
  int64_t lost = 0, count = 0, async_count = 0, bytes = 0, time = 0;
  std::map<CopyKind, double> expected;
  Offenders kinds;
  for (const auto& m : t_.memcpys) {
    if (m.src != MemoryKind::pageable && m.dst != MemoryKind::pageable) continue;
    ++count;
    bytes += m.bytes;
    time += m.duration_ns();
    const auto api = by_correlation_.find(m.correlation);
    if (api == by_correlation_.end() || api->second->name.find("Async") != std::string::npos) ++async_count;
    kinds.add("Memcpy " + std::string(copy_kind_name(m.kind)) + " (" + std::string(memory_kind_name(m.src)) +
                  " -> " + std::string(memory_kind_name(m.dst)) + ")",
              m.duration_ns());
    if (!expected.count(m.kind)) {
      double gbps = th_.get("pageable_memcpy.pinned_gbps");
      if (gbps <= 0) gbps = std::max(best_pinned_gbps(t_, m.kind, min_bytes), 0.7 * link.gbps);
      if (gbps <= 0) gbps = 10;  // a conservative PCIe gen 3/4 pinned rate
      expected[m.kind] = gbps;
    }
    const double pinned_ns = double(m.bytes) / expected[m.kind];
    lost += std::max<int64_t>(0, m.duration_ns() - int64_t(pinned_ns));
  }
  if (count == 0) return;
  json exp = json::object();
  for (const auto& [k, g] : expected) exp[std::string(copy_kind_name(k))] = round3(g);
  add_finding("pageable_memcpy", double(lost),
              std::to_string(count) + " copies touch pageable host memory (" + std::to_string(async_count) +
                  " issued as async)",
              {{"copies", count}, {"async_copies", async_count}, {"bytes", bytes}, {"copy_time_ms", ms(time)},
               {"achieved_gbps", round3(time > 0 ? double(bytes) / double(time) : 0)},
               {"expected_pinned_gbps", exp}, {"link", link.source}, {"top_offenders", kinds.top()}});
}

void Analyzer::rule_pcie() {
  const int64_t min_bytes = int64_t(th_.get("pcie_saturation.min_bytes"));
  const double fraction = th_.get("pcie_saturation.min_fraction");
  Link host = host_link(t_);
  const bool link_given = th_.get("pcie_saturation.link_gbps") > 0;
  if (link_given) host = {th_.get("pcie_saturation.link_gbps"), "pcie_saturation.link_gbps"};
  const double link = host.gbps;
  std::vector<Interval> saturated;
  int64_t bytes = 0, count = 0;
  json ceilings = json::object();
  for (CopyKind kind : {CopyKind::htod, CopyKind::dtoh}) {
    const double observed = best_pinned_gbps(t_, kind, min_bytes);
    if (observed <= 0) continue;
    // NVML may report a down-trained idle link, so an observed rate above it wins.
    const double ceiling = link_given ? link : std::max(link, observed);
    ceilings[std::string(copy_kind_name(kind))] = round3(ceiling);
    for (const auto& m : t_.memcpys)
      if (m.kind == kind && m.src != MemoryKind::pageable && m.dst != MemoryKind::pageable &&
          m.bytes >= min_bytes && m.duration_ns() > 0 &&
          double(m.bytes) / double(m.duration_ns()) >= fraction * ceiling) {
        saturated.push_back({m.start_ns, m.end_ns});
        bytes += m.bytes;
        ++count;
      }
  }
  if (count == 0) return;
  saturated = merged(saturated);
  const int64_t copy_time = total_length(saturated);
  const int64_t alone = copy_time - overlap(saturated, kernel_busy_);
  add_finding("pcie_saturation", double(alone),
              std::to_string(count) + " host-device copies run near the link ceiling while no kernel runs",
              {{"copies", count}, {"bytes", bytes}, {"copy_time_ms", ms(copy_time)},
               {"copy_without_kernels_ms", ms(alone)},
               {"achieved_gbps", round3(double(bytes) / double(std::max<int64_t>(copy_time, 1)))},
               {"ceiling_gbps", ceilings}, {"link_gbps", round3(link)}, {"link", host.source}});
}

void Analyzer::rule_occupancy() {
  int64_t total = 0, low_time = 0, low_count = 0;
  double lost = 0;
  Offenders names;
  int sms_seen = 0;
  for (const auto& k : t_.kernels) {
    total += k.duration_ns();
    int sms = int(th_.get("low_occupancy.sm_count"));
    if (sms <= 0) {
      const auto d = t_.devices.find(k.device);
      sms = d == t_.devices.end() ? 0 : d->second.sm_count;
    }
    if (sms <= 0 || k.blocks() >= sms) continue;
    sms_seen = sms;
    ++low_count;
    low_time += k.duration_ns();
    lost += double(k.duration_ns()) * (1.0 - double(k.blocks()) / sms);
    names.add(k.name, k.duration_ns());
  }
  if (low_count == 0 || double(low_time) < th_.get("low_occupancy.min_share") * double(total)) return;
  add_finding("low_occupancy", lost,
              std::to_string(low_count) + " kernels launch fewer blocks than the " + std::to_string(sms_seen) +
                  " SMs",
              {{"kernels", low_count}, {"kernel_time_ms", ms(low_time)},
               {"share_of_kernel_time_percent", round3(100.0 * double(low_time) / double(std::max<int64_t>(total, 1)))},
               {"sm_count", sms_seen}, {"top_offenders", names.top()}});
}

// Ping-pong test: the same managed pages moved more than once, in both directions.
void Analyzer::check_um() {
  int64_t htod = 0, dtoh = 0, cpu_faults = 0, gpu_faults = 0, thrash = 0;
  std::vector<Interval> moves, ranges;  // ranges: migrated address ranges, as intervals
  for (const auto& e : t_.um_events) {
    switch (e.kind) {
      case UmKind::htod_migration:
      case UmKind::dtoh_migration: {
        (e.kind == UmKind::htod_migration ? htod : dtoh) += e.value;
        ranges.push_back({int64_t(e.address), int64_t(e.address) + e.value});
        moves.push_back({e.start_ns, std::max(e.end_ns, e.start_ns)});
        if (e.kind == UmKind::dtoh_migration) um_host_times_.push_back(e.start_ns);
        break;
      }
      case UmKind::cpu_fault:
        cpu_faults += std::max<int64_t>(e.value, 1);
        um_host_times_.push_back(e.start_ns);
        break;
      case UmKind::gpu_fault: gpu_faults += std::max<int64_t>(e.value, 1); break;
      case UmKind::thrashing: ++thrash; break;
      case UmKind::throttling: break;
    }
  }
  std::sort(um_host_times_.begin(), um_host_times_.end());
  um_migrations_ = merged(moves);
  const int64_t footprint = total_length(merged(ranges));  // distinct bytes, whatever the chunking
  const double ratio = footprint > 0 ? double(htod + dtoh) / double(footprint) : 0;
  um_pingpong_ = thrash > 0 || (htod > 0 && dtoh > 0 && ratio >= th_.get("um_thrashing.min_remigration"));
  const double migrated_mb = double(htod + dtoh) / 1e6;
  um_evidence_ = {{"htod_bytes", htod}, {"dtoh_bytes", dtoh}, {"distinct_bytes", footprint},
                  {"remigration_ratio", round3(ratio)}, {"cpu_faults", cpu_faults}, {"gpu_faults", gpu_faults},
                  {"faults_per_mb", round3(migrated_mb > 0 ? double(cpu_faults + gpu_faults) / migrated_mb : 0)},
                  {"thrashing_events", thrash}, {"migration_time_ms", ms(total_length(um_migrations_))}};
}

// The kernels that took the most GPU time, summed by name (Nsight's cuda_gpu_kern_sum): where
// to look first once the GPU is busy.
json Analyzer::top_kernels(size_t limit) const {
  struct Total {
    int64_t count = 0, ns = 0;
  };
  std::map<std::string, Total> by_name;
  int64_t all_ns = 0;
  for (const auto& k : t_.kernels) {
    Total& t = by_name[k.name];
    ++t.count;
    t.ns += k.end_ns - k.start_ns;
    all_ns += k.end_ns - k.start_ns;
  }
  std::vector<std::pair<std::string, Total>> ranked(by_name.begin(), by_name.end());
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  json out = json::array();
  for (size_t i = 0; i < std::min(limit, ranked.size()); ++i) {
    const auto& [name, t] = ranked[i];
    out.push_back({{"name", name},
                   {"count", t.count},
                   {"total_ms", ms(t.ns)},
                   {"mean_us", round3(double(t.ns) / double(t.count) / 1e3)},
                   {"percent_of_kernel_time", round3(all_ns > 0 ? 100.0 * double(t.ns) / double(all_ns) : 0)}});
  }
  return out;
}

Report Analyzer::run() {
  check_um();
  attribute_gaps();
  rule_attributed();
  rule_symptoms();
  rule_pageable();
  rule_pcie();
  rule_occupancy();
  std::stable_sort(findings_.begin(), findings_.end(),
                   [](const Finding& a, const Finding& b) { return a.time_lost_ms > b.time_lost_ms; });
  Report r;
  r.findings = std::move(findings_);
  const int64_t busy = total_length(busy_);
  json devices = json::array();
  for (const auto& [id, d] : t_.devices)
    devices.push_back({{"id", id}, {"name", d.name}, {"sm_count", d.sm_count},
                       {"compute_capability", std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor)},
                       {"pcie_generation", d.pcie_generation}, {"pcie_width", d.pcie_width}});
  r.summary = {{"source", t_.source},
               {"span_ms", ms(span_.length())},
               {"gpu_busy_ms", ms(busy)},
               {"gpu_busy_percent", round3(span_.length() > 0 ? 100.0 * double(busy) / double(span_.length()) : 0)},
               {"kernels", t_.kernels.size()},
               {"memcpys", t_.memcpys.size()},
               {"memsets", t_.memsets.size()},
               {"api_calls", t_.api_calls.size()},
               {"um_events", t_.um_events.size()},
               {"um_counters_enabled", t_.um_counters_enabled},
               {"nvml_samples", t_.samples.size()},
               {"dropped_records", t_.dropped_records},
               {"devices", devices}};
  r.summary["nvtx_ranges"] = t_.ranges.size();
  if (t_.window) {
    const AnalysisWindow& w = *t_.window;
    r.summary["window"] = {{"capture_range", w.range},
                           {"occurrences", w.occurrences},
                           {"start_ms", ms(w.start_ns - w.trace_start_ns)},
                           {"end_ms", ms(w.end_ns - w.trace_start_ns)},
                           {"length_ms", ms(w.end_ns - w.start_ns)}};
  }
  r.summary["top_kernels"] = top_kernels(10);
  if (!t_.notes.empty()) r.summary["notes"] = t_.notes;
  if (!t_.samples.empty()) {
    double sum = 0;
    int n = 0;
    for (const auto& s : t_.samples)
      if (s.sm_util_percent >= 0) sum += s.sm_util_percent, ++n;
    if (n > 0) r.summary["nvml_mean_gpu_util_percent"] = round3(sum / n);
  }
  return r;
}

}  // namespace

std::string_view severity_name(Severity s) {
  switch (s) {
    case Severity::high: return "high";
    case Severity::medium: return "medium";
    default: return "low";
  }
}

Thresholds::Thresholds() {
  for (const auto& [key, spec] : kDefaults) values_[key] = spec.value;
}

double Thresholds::get(const std::string& key) const {
  const auto it = values_.find(key);
  if (it == values_.end()) throw core::Error("internal: no threshold named " + key);
  return it->second;
}

void Thresholds::set(const std::string& key, double value) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    std::string known;
    for (const auto& [k, v] : values_) known += (known.empty() ? "" : ", ") + k;
    throw core::InputError("unknown threshold '" + key + "'; known: " + known);
  }
  const double most = kDefaults.at(key).most;
  if (!(value >= 0 && value <= most)) {
    std::ostringstream m;
    m << "threshold " << key << " must be between 0 and " << most << ", not " << value;
    throw core::InputError(m.str());
  }
  it->second = value;
}

void Thresholds::set_from_text(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos)
    throw core::InputError("--threshold expects rule.key=value, got '" + assignment + "'");
  const std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value))
    throw core::InputError("--threshold " + key + ": '" + text + "' is not a number");
  set(key, value);
}

const std::vector<std::string>& rule_ids() {
  static const std::vector<std::string> ids = {
      "low_gpu_utilization", "gpu_idle_gaps", "launch_bound", "host_starved", "pageable_memcpy",
      "sync_memcpy", "sync_memset", "sync_api", "um_thrashing", "pcie_saturation", "low_occupancy"};
  return ids;
}

Report analyze(const Trace& trace, const Thresholds& thresholds) {
  return Analyzer(trace, thresholds).run();
}

json report_json(const Report& report) {
  json findings = json::array();
  for (const auto& f : report.findings)
    findings.push_back({{"rule", f.rule}, {"severity", severity_name(f.severity)}, {"time_lost_ms", f.time_lost_ms},
                        {"summary", f.summary}, {"evidence", f.evidence}, {"fix", f.fix}});
  return {{"findings", findings}, {"summary", report.summary}};
}

}  // namespace gpulab::trace
