#include "trace/chrome_trace.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace gpulab::trace {

using nlohmann::json;

namespace {

constexpr int64_t kHostPid = 1'000'000;  // GPU events use the device index as pid, as Kineto does
constexpr int64_t kUmTid = 1'000'000;    // the unified-memory row under each device

// NVML counter names in the written trace and the sample field each fills.
const std::vector<std::pair<const char*, double NvmlSample::*>> kNvmlFields = {
    {"SM utilization (%)", &NvmlSample::sm_util_percent},
    {"memory utilization (%)", &NvmlSample::mem_util_percent},
    {"PCIe rx (MB/s)", &NvmlSample::pcie_rx_mbps},
    {"PCIe tx (MB/s)", &NvmlSample::pcie_tx_mbps},
    {"power (W)", &NvmlSample::power_w},
    {"SM clock (MHz)", &NvmlSample::sm_clock_mhz},
    {"memory clock (MHz)", &NvmlSample::mem_clock_mhz},
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// An integer JSON number within [lo, hi]; nothing otherwise (a float or a huge value is not
// cast: that would be undefined behaviour).
std::optional<int64_t> int_within(const json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))) return std::nullopt;
  const int64_t n = v.get<int64_t>();
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

// obj[key] as an integer in [0, hi]; `fallback` when absent; anything else makes the trace malformed.
int64_t count_field(const json& obj, const char* key, int64_t fallback, int64_t hi, const std::string& source) {
  const auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  const auto n = int_within(*it, 0, hi);
  if (!n) throw core::InputError(source + ": malformed trace: \"" + key + "\" is not an integer in [0, " + std::to_string(hi) + "]");
  return *n;
}

// Reads one event; every accessor names the event on failure. Times are absolute (the document's
// baseTimeNanoseconds added) and kept within ±2^62 ns, so that differences cannot overflow.
class EventReader {
 public:
  EventReader(const json& e, size_t index, const std::string& source, int64_t base)
      : e_(e), index_(index), source_(source), base_(base) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw core::InputError(source_ + ": trace event " + std::to_string(index_) +
                           (e_.contains("name") && e_["name"].is_string() ? " (" + e_["name"].get<std::string>() + ")" : "") +
                           ": " + what);
  }
  // Microsecond field as nanoseconds.
  int64_t time_ns(const char* key) const {
    const auto it = e_.find(key);
    if (it == e_.end() || !it->is_number()) fail(std::string("missing or non-numeric \"") + key + "\"");
    const double v = it->get<double>();
    if (!std::isfinite(v) || std::fabs(v) > 4e15) fail(std::string("\"") + key + "\" out of range");
    return std::llround(v * 1000.0);
  }
  int64_t start_ns() const { return offset(time_ns("ts"), base_, "\"ts\" plus baseTimeNanoseconds"); }
  int64_t end_ns(int64_t start) const { return offset(start, time_ns("dur"), "\"ts\" plus \"dur\""); }
  // An integer that Kineto writes either as a number or as a string ("stream": 7, "tid": "7").
  static std::optional<int64_t> as_int(const json& v) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number()) {
      const double d = v.get<double>();
      if (!(std::fabs(d) < 9e18)) return std::nullopt;  // NaN, infinite or beyond int64_t
      return int64_t(d);
    }
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      size_t used = 0;
      try {
        const long long n = std::stoll(s, &used);
        if (used == s.size()) return n;
      } catch (const std::exception&) {
      }
      return int64_t(std::hash<std::string>{}(s) & 0x7fffffff);  // named threads
    }
    return std::nullopt;
  }
  int64_t top_int(const char* key, int64_t fallback) const {
    const auto it = e_.find(key);
    if (it == e_.end()) return fallback;
    return as_int(*it).value_or(fallback);
  }
  const json* arg(const char* key) const {
    const auto a = e_.find("args");
    if (a == e_.end() || !a->is_object()) return nullptr;
    const auto it = a->find(key);
    return it == a->end() || it->is_null() ? nullptr : &*it;
  }
  int64_t arg_int(const char* key, int64_t fallback) const {
    const json* v = arg(key);
    if (!v) return fallback;
    const auto n = as_int(*v);
    if (!n) fail(std::string("argument \"") + key + "\" is not a number");
    return *n;
  }
  std::array<int, 3> arg_dim3(const char* key) const {
    const json* v = arg(key);
    std::array<int, 3> d{1, 1, 1};
    if (!v) return d;
    if (!v->is_array() || v->size() > 3) fail(std::string("argument \"") + key + "\" is not [x, y, z]");
    for (size_t i = 0; i < v->size(); ++i) {
      const auto n = int_within((*v)[i], 0, INT_MAX);
      if (!n) fail(std::string("argument \"") + key + "\" is not [x, y, z] of non-negative integers");
      d[i] = int(*n);
    }
    return d;
  }
  std::string name() const {
    const auto it = e_.find("name");
    return it != e_.end() && it->is_string() ? it->get<std::string>() : std::string();
  }
  void fill(GpuActivity& a) const {
    a.start_ns = start_ns();
    a.end_ns = end_ns(a.start_ns);
    a.device = int(arg_int("device", top_int("pid", 0)));
    a.stream = arg_int("stream", top_int("tid", 0));
    a.correlation = arg_int("correlation", 0);
  }

 private:
  int64_t offset(int64_t a, int64_t b, const char* what) const {
    constexpr int64_t kLimit = (int64_t{1} << 62) - 1;
    int64_t t = 0;
    if (__builtin_add_overflow(a, b, &t) || t > kLimit || t < -kLimit) fail(std::string(what) + " out of range");
    return t;
  }

  const json& e_;
  size_t index_;
  const std::string& source_;
  int64_t base_;
};

// "Memcpy HtoD (Pageable -> Device)"; unknown parts stay unknown.
void parse_memcpy_name(const std::string& name, Memcpy& m) {
  const auto space = name.find(' '), open = name.find(" ("), arrow = name.find(" -> "), close = name.rfind(')');
  if (space != std::string::npos)
    m.kind = parse_copy_kind(name.substr(space + 1, open == std::string::npos ? std::string::npos : open - space - 1))
                 .value_or(CopyKind::unknown);
  if (open != std::string::npos && arrow != std::string::npos && close != std::string::npos && arrow > open) {
    m.src = parse_memory_kind(name.substr(open + 2, arrow - open - 2)).value_or(MemoryKind::unknown);
    m.dst = parse_memory_kind(name.substr(arrow + 4, close - arrow - 4)).value_or(MemoryKind::unknown);
  }
}

// "Memset (Device)"
MemoryKind parse_memset_name(const std::string& name) {
  const auto open = name.find('('), close = name.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close <= open) return MemoryKind::unknown;
  return parse_memory_kind(name.substr(open + 1, close - open - 1)).value_or(MemoryKind::unknown);
}

double us(int64_t ns) { return double(ns) / 1000.0; }

// Older PyTorch profilers wrote capitalised categories without the prefixes.
std::string canonical_category(const json& e) {
  const auto it = e.find("cat");
  if (it == e.end() || !it->is_string()) return "";
  const std::string cat = lower(it->get<std::string>());
  if (cat == "runtime") return "cuda_runtime";
  if (cat == "driver") return "cuda_driver";
  if (cat == "memcpy") return "gpu_memcpy";
  if (cat == "memset") return "gpu_memset";
  return cat;
}

Trace parse_events(const json& doc, const std::string& source) {
  const json* events = nullptr;
  if (doc.is_array()) events = &doc;
  else if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array()) events = &doc["traceEvents"];
  if (!events)
    throw core::InputError(source + ": not a Chrome trace (expected an object with a \"traceEvents\" array)");

  Trace t;
  t.source = source;
  int64_t base = 0;
  if (doc.is_object()) {
    if (auto it = doc.find("baseTimeNanoseconds"); it != doc.end() && it->is_number_integer()) base = it->get<int64_t>();
    if (auto it = doc.find("deviceProperties"); it != doc.end() && it->is_array())
      for (const auto& d : *it) {
        if (!d.is_object() || !d.contains("id") || !d["id"].is_number()) continue;
        DeviceInfo info;
        info.name = d.value("name", "");
        info.sm_count = int(count_field(d, "numSms", 0, INT_MAX, source));
        info.pcie_generation = int(count_field(d, "pcieGeneration", 0, INT_MAX, source));
        info.pcie_width = int(count_field(d, "pcieWidth", 0, INT_MAX, source));
        t.devices[int(count_field(d, "id", 0, INT_MAX, source))] = info;
      }
    if (auto it = doc.find("gpulab"); it != doc.end() && it->is_object()) {
      t.dropped_records = count_field(*it, "dropped_records", 0, INT64_MAX, source);
      t.um_counters_enabled = it->value("um_counters_enabled", false);
    }
  }

  std::map<std::pair<int64_t, int64_t>, NvmlSample> samples;  // (time, device)
  for (size_t i = 0; i < events->size(); ++i) {
    const json& e = (*events)[i];
    if (!e.is_object()) throw core::InputError(source + ": trace event " + std::to_string(i) + " is not an object");
    const EventReader r(e, i, source, base);
    const auto ph_it = e.find("ph");
    const std::string ph = ph_it != e.end() && ph_it->is_string() ? ph_it->get<std::string>() : "";
    const std::string cat = canonical_category(e);
    if (ph == "C" && cat == "gpulab_nvml") {
      const int64_t ts = r.start_ns();
      NvmlSample& s = samples[{ts, r.top_int("pid", 0)}];
      s.time_ns = ts;
      s.device = int(r.top_int("pid", 0));
      const std::string name = r.name();
      for (const auto& [field, member] : kNvmlFields)
        if (name == field) {
          const json* v = r.arg("value");
          if (!v || !v->is_number()) r.fail("counter without a numeric \"value\"");
          s.*member = v->get<double>();
        }
      continue;
    }
    if (ph != "X") continue;
    if (cat == "kernel") {
      Kernel k;
      r.fill(k);
      k.name = r.name();
      k.grid = r.arg_dim3("grid");
      k.block = r.arg_dim3("block");
      k.registers = int(r.arg_int("registers per thread", 0));
      k.shared_memory = r.arg_int("shared memory", 0);
      t.kernels.push_back(std::move(k));
    } else if (cat == "gpu_memcpy") {
      Memcpy m;
      r.fill(m);
      parse_memcpy_name(r.name(), m);
      m.bytes = r.arg_int("bytes", 0);
      t.memcpys.push_back(m);
    } else if (cat == "gpu_memset") {
      Memset m;
      r.fill(m);
      m.dst = parse_memset_name(r.name());
      m.bytes = r.arg_int("bytes", 0);
      t.memsets.push_back(m);
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      ApiCall c;
      c.name = r.name();
      c.start_ns = r.start_ns();
      c.end_ns = r.end_ns(c.start_ns);
      c.thread = r.top_int("tid", 0);
      c.correlation = r.arg_int("correlation", 0);
      c.driver = cat == "cuda_driver";
      t.api_calls.push_back(std::move(c));
    } else if (cat == "gpulab_um") {
      UmEvent u;
      const auto kind = parse_um_kind(r.name());
      if (!kind) r.fail("unknown unified-memory event kind");
      u.kind = *kind;
      u.start_ns = r.start_ns();
      u.end_ns = r.end_ns(u.start_ns);
      u.address = uint64_t(r.arg_int("address", 0));
      u.value = r.arg_int("value", 0);
      u.device = int(r.top_int("pid", 0));
      t.um_events.push_back(u);
    }
  }
  for (auto& [key, s] : samples) t.samples.push_back(s);
  return t;
}

}  // namespace

Trace parse_chrome_trace(const json& doc, const std::string& source) {
  try {
    return parse_events(doc, source);
  } catch (const json::exception& e) {  // a field of the wrong JSON type somewhere
    throw core::InputError(source + ": malformed trace: " + e.what());
  }
}

Trace read_chrome_trace(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::InputError(path.string() + ": cannot open the trace file");
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {  // parse errors, and numbers beyond double (out_of_range)
    throw core::InputError(path.string() + ": not valid JSON (" + e.what() + ")");
  }
  return parse_chrome_trace(doc, path.string());
}

std::string chrome_trace_json(const Trace& t) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  const auto see = [&](int64_t ns) { origin = std::min(origin, ns); };
  for (const auto& k : t.kernels) see(k.start_ns);
  for (const auto& m : t.memcpys) see(m.start_ns);
  for (const auto& m : t.memsets) see(m.start_ns);
  for (const auto& c : t.api_calls) see(c.start_ns);
  for (const auto& u : t.um_events) see(u.start_ns);
  for (const auto& s : t.samples) see(s.time_ns);
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;

  json events = json::array();
  const auto x_event = [&](const std::string& cat, const std::string& name, int64_t pid, int64_t tid,
                           int64_t start, int64_t end, json args) {
    events.push_back({{"ph", "X"}, {"cat", cat}, {"name", name}, {"pid", pid}, {"tid", tid},
                      {"ts", us(start - origin)}, {"dur", us(end - start)}, {"args", std::move(args)}});
  };
  std::map<int64_t, const ApiCall*> launches;  // correlation -> runtime (or driver) call, for flows
  for (const auto& c : t.api_calls) {
    x_event(c.driver ? "cuda_driver" : "cuda_runtime", c.name, kHostPid, c.thread, c.start_ns, c.end_ns,
            {{"correlation", c.correlation}});
    if (c.correlation != 0 && (!launches.count(c.correlation) || !c.driver)) launches[c.correlation] = &c;
  }
  const auto flow = [&](const GpuActivity& a) {
    const auto it = launches.find(a.correlation);
    if (a.correlation == 0 || it == launches.end()) return;
    events.push_back({{"ph", "s"}, {"id", a.correlation}, {"pid", kHostPid}, {"tid", it->second->thread},
                      {"ts", us(it->second->start_ns - origin)}, {"cat", "ac2g"}, {"name", "ac2g"}});
    events.push_back({{"ph", "f"}, {"id", a.correlation}, {"pid", a.device}, {"tid", a.stream},
                      {"ts", us(a.start_ns - origin)}, {"cat", "ac2g"}, {"name", "ac2g"}, {"bp", "e"}});
  };
  const auto gpu_args = [](const GpuActivity& a) {
    return json{{"device", a.device}, {"stream", a.stream}, {"correlation", a.correlation}};
  };
  for (const auto& k : t.kernels) {
    json args = gpu_args(k);
    args["grid"] = k.grid;
    args["block"] = k.block;
    args["registers per thread"] = k.registers;
    args["shared memory"] = k.shared_memory;
    x_event("kernel", k.name, k.device, k.stream, k.start_ns, k.end_ns, std::move(args));
    flow(k);
  }
  for (const auto& m : t.memcpys) {
    json args = gpu_args(m);
    args["bytes"] = m.bytes;
    if (m.duration_ns() > 0) args["memory bandwidth (GB/s)"] = double(m.bytes) / double(m.duration_ns());
    x_event("gpu_memcpy",
            "Memcpy " + std::string(copy_kind_name(m.kind)) + " (" + std::string(memory_kind_name(m.src)) + " -> " +
                std::string(memory_kind_name(m.dst)) + ")",
            m.device, m.stream, m.start_ns, m.end_ns, std::move(args));
    flow(m);
  }
  for (const auto& m : t.memsets) {
    json args = gpu_args(m);
    args["bytes"] = m.bytes;
    x_event("gpu_memset", "Memset (" + std::string(memory_kind_name(m.dst)) + ")", m.device, m.stream, m.start_ns,
            m.end_ns, std::move(args));
    flow(m);
  }
  std::map<int, bool> um_rows;
  for (const auto& u : t.um_events) {
    x_event("gpulab_um", std::string(um_kind_name(u.kind)), u.device, kUmTid, u.start_ns, std::max(u.end_ns, u.start_ns),
            {{"address", u.address}, {"value", u.value}});
    um_rows[u.device] = true;
  }
  for (const auto& s : t.samples)
    for (const auto& [name, member] : kNvmlFields)
      if (s.*member >= 0)
        events.push_back({{"ph", "C"}, {"cat", "gpulab_nvml"}, {"name", name}, {"pid", s.device},
                          {"ts", us(s.time_ns - origin)}, {"args", {{"value", s.*member}}}});

  // Row names for Perfetto.
  const auto meta = [&](const char* what, int64_t pid, std::optional<int64_t> tid, const std::string& name) {
    json m = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{"name", name}}}};
    if (tid) m["tid"] = *tid;
    events.push_back(std::move(m));
  };
  meta("process_name", kHostPid, std::nullopt, "host (CUDA API)");
  std::map<int, bool> gpus;
  for (const auto& k : t.kernels) gpus[k.device] = true;
  for (const auto& m : t.memcpys) gpus[m.device] = true;
  for (const auto& m : t.memsets) gpus[m.device] = true;
  for (const auto& [id, d] : t.devices) gpus[id] = true;
  for (const auto& [id, unused] : gpus) {
    const auto d = t.devices.find(id);
    meta("process_name", id, std::nullopt, "GPU " + std::to_string(id) + (d != t.devices.end() ? " " + d->second.name : ""));
  }
  for (const auto& [id, unused] : um_rows) meta("thread_name", id, kUmTid, "unified memory");

  json props = json::array();
  for (const auto& [id, d] : t.devices)
    props.push_back({{"id", id}, {"name", d.name}, {"numSms", d.sm_count}, {"pcieGeneration", d.pcie_generation},
                     {"pcieWidth", d.pcie_width}});
  const json doc = {{"schemaVersion", 1},
                    {"displayTimeUnit", "ms"},
                    {"baseTimeNanoseconds", origin},
                    {"deviceProperties", props},
                    {"gpulab", {{"dropped_records", t.dropped_records},
                                {"um_counters_enabled", t.um_counters_enabled},
                                {"source", t.source}}},
                    {"traceEvents", events}};
  return doc.dump();
}

}  // namespace gpulab::trace
