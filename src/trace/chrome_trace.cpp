#include "trace/chrome_trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>
#include <unordered_set>

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

// What the reader tolerated, grouped by problem: how often, and the first event it hit.
class Notes {
 public:
  void add(const std::string& problem, size_t index, const std::string& name) {
    auto [it, inserted] = entries_.try_emplace(problem);
    if (inserted) {
      order_.push_back(problem);
      it->second.first = "event " + std::to_string(index) + (name.empty() ? "" : " \"" + utf8_prefix(name, 80) + "\"");
    }
    ++it->second.count;
  }
  void add_line(std::string line) { lines_.push_back(std::move(line)); }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    for (const auto& p : order_) {
      const Entry& e = entries_.at(p);
      out.push_back(std::to_string(e.count) + " x " + p + " (first: " + e.first + ")");
    }
    out.insert(out.end(), lines_.begin(), lines_.end());
    return out;
  }

 private:
  struct Entry {
    int64_t count = 0;
    std::string first;
  };
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_, lines_;
};

// A number, or a string holding one ("ts": "12.5", "stream": "7"): some writers quote them.
std::optional<double> as_number(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (!v.is_string()) return std::nullopt;
  const std::string s = v.get<std::string>();
  size_t used = 0;
  try {
    const double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// A finite number within int64 range, truncated.
std::optional<int64_t> as_integer(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();  // exact beyond 2^53 (addresses)
  const auto n = as_number(v);
  if (!n || !std::isfinite(*n) || std::fabs(*n) >= 9.2e18) return std::nullopt;
  return int64_t(*n);
}

// Reads one event; a missing or malformed field is noted (with the event's category) and
// replaced by its default, or makes the caller skip the event.
class EventReader {
 public:
  EventReader(const json& e, size_t index, const std::string& cat, Notes& notes)
      : e_(e), index_(index), cat_(cat), notes_(notes) {}

  void note(const std::string& problem) const { notes_.add(cat_ + " event " + problem, index_, name()); }
  // Microsecond field as nanoseconds; nullopt (noted) when missing, non-numeric or absurd.
  std::optional<int64_t> time_ns(const char* key) const {
    const auto it = e_.find(key);
    const auto v = it == e_.end() ? std::nullopt : as_number(*it);
    if (!v) {
      note(std::string("without a numeric \"") + key + "\", skipped");
      return std::nullopt;
    }
    if (!std::isfinite(*v) || std::fabs(*v) > 4e15) {
      note(std::string("with \"") + key + "\" out of range, skipped");
      return std::nullopt;
    }
    return std::llround(*v * 1000.0);
  }
  // Start and end in ns ("ts", "ts" + "dur"), nullopt (noted) when either is unusable.
  std::optional<std::pair<int64_t, int64_t>> span(int64_t base) const {
    const auto ts = time_ns("ts");
    if (!ts) return std::nullopt;
    const auto dur = time_ns("dur");
    if (!dur) return std::nullopt;
    if (*dur < 0) {
      note("with a negative \"dur\", skipped");
      return std::nullopt;
    }
    int64_t start = 0, end = 0;  // the document's base may push either past int64_t
    if (__builtin_add_overflow(*ts, base, &start) || __builtin_add_overflow(start, *dur, &end)) {
      note("with \"ts\" plus the base time out of range, skipped");
      return std::nullopt;
    }
    return std::pair{start, end};
  }
  // An integer that Kineto writes either as a number or as a string ("stream": 7, "tid": "7");
  // other strings (named rows such as "Spans") map to a stable hash.
  static std::optional<int64_t> as_int(const json& v) {
    if (const auto n = as_integer(v)) return n;
    if (v.is_string()) return int64_t(std::hash<std::string>{}(v.get<std::string>()) & 0x7fffffff);
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
    const auto n = as_integer(*v);
    if (!n) note(std::string("with a non-numeric argument \"") + key + "\", ignored");
    return n.value_or(fallback);
  }
  std::array<int, 3> arg_dim3(const char* key) const {
    const json* v = arg(key);
    std::array<int, 3> d{1, 1, 1};
    if (!v) return d;
    bool ok = v->is_array() && v->size() <= 3;
    for (size_t i = 0; ok && i < v->size(); ++i) {
      const auto n = as_number((*v)[i]);
      ok = n && *n >= 0 && *n < 2147483648.0;
      if (ok) d[i] = int(*n);
    }
    if (ok) return d;
    note(std::string("with argument \"") + key + "\" not [x, y, z], ignored");
    return {1, 1, 1};
  }
  std::string name() const {
    const auto it = e_.find("name");
    return it != e_.end() && it->is_string() ? it->get<std::string>() : std::string();
  }
  bool fill(GpuActivity& a, int64_t base) const {
    const auto s = span(base);
    if (!s) return false;
    std::tie(a.start_ns, a.end_ns) = *s;
    a.device = int(arg_int("device", top_int("pid", 0)));
    a.stream = arg_int("stream", top_int("tid", 0));
    a.correlation = arg_int("correlation", 0);
    return true;
  }

 private:
  const json& e_;
  size_t index_;
  const std::string& cat_;
  Notes& notes_;
};

// "Memcpy HtoD (Pageable -> Device)"; unknown parts stay unknown. False when the memory kinds are
// missing or unrecognised.
bool parse_memcpy_name(const std::string& name, Memcpy& m) {
  const auto space = name.find(' '), open = name.find(" ("), arrow = name.find(" -> "), close = name.rfind(')');
  if (space != std::string::npos)
    m.kind = parse_copy_kind(name.substr(space + 1, open == std::string::npos ? std::string::npos : open - space - 1))
                 .value_or(CopyKind::unknown);
  if (open == std::string::npos || arrow == std::string::npos || close == std::string::npos || arrow < open)
    return false;
  const auto src = parse_memory_kind(name.substr(open + 2, arrow - open - 2));
  const auto dst = parse_memory_kind(name.substr(arrow + 4, close - arrow - 4));
  m.src = src.value_or(MemoryKind::unknown);
  m.dst = dst.value_or(MemoryKind::unknown);
  return src && dst && m.kind != CopyKind::unknown;
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

// A field of a top-level object as T, or `fallback` (noted) when it has another JSON type.
// obj[key] as T, `fallback` when absent; a value of another type, or a number beyond T's range
// (never cast: that would be undefined behaviour), is noted and ignored.
template <class T>
T field(const json& obj, const char* key, T fallback, const std::string& where, Notes& notes) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const auto n = as_integer(*it);
    if (n && *n >= std::numeric_limits<T>::min() && *n <= std::numeric_limits<T>::max()) return T(*n);
    notes.add_line(where + " \"" + key + "\" " +
                   (it->is_number() ? "is not an integer in range" : "has an unexpected type") + ", ignored");
    return fallback;
  } else {
    try {
      return it->get<T>();
    } catch (const json::exception&) {
      notes.add_line(where + " \"" + key + "\" has an unexpected type, ignored");
      return fallback;
    }
  }
}

// What the trace lacks for the cause rules, said once rather than discovered as empty findings.
void note_missing_links(const Trace& t, Notes& notes) {
  std::unordered_set<int64_t> issued;
  for (const auto& c : t.api_calls)
    if (c.correlation != 0) issued.insert(c.correlation);
  int64_t total = 0, without = 0, unmatched = 0;
  const auto see = [&](const GpuActivity& a) {
    ++total;
    if (a.correlation == 0) ++without;
    else if (!issued.count(a.correlation)) ++unmatched;
  };
  for (const auto& k : t.kernels) see(k);
  for (const auto& m : t.memcpys) see(m);
  for (const auto& m : t.memsets) see(m);
  if (total == 0) return;
  if (t.api_calls.empty()) {
    notes.add_line("no CUDA runtime or driver API events: idle GPU time cannot be given a cause (record the host "
                   "side too, e.g. torch.profiler with ProfilerActivity.CPU)");
    return;
  }
  if (without > 0)
    notes.add_line(std::to_string(without) + " of " + std::to_string(total) +
                   " GPU events carry no correlation id: gaps before them cannot be given a cause");
  if (unmatched > 0)
    notes.add_line(std::to_string(unmatched) + " of " + std::to_string(total) +
                   " GPU events have no API call with their correlation id in the trace (issued before it began?)");
}

Trace parse_events(const json& doc, const std::string& source) {
  const json* events = nullptr;
  if (doc.is_array()) events = &doc;
  else if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array()) events = &doc["traceEvents"];
  if (!events)
    throw core::InputError(source + ": not a Chrome trace (expected an object with a \"traceEvents\" array)");

  Trace t;
  t.source = source;
  Notes notes;
  int64_t base = 0;
  if (doc.is_object()) {
    base = field<int64_t>(doc, "baseTimeNanoseconds", 0, "top-level", notes);
    if (auto it = doc.find("deviceProperties"); it != doc.end() && it->is_array())
      for (const auto& d : *it) {
        if (!d.is_object() || !d.contains("id") || !d["id"].is_number()) {
          notes.add_line("a deviceProperties entry without a numeric \"id\", ignored");
          continue;
        }
        const std::string where = "deviceProperties " + d["id"].dump();
        DeviceInfo info;
        info.name = field<std::string>(d, "name", "", where, notes);
        info.sm_count = field<int>(d, "numSms", 0, where, notes);
        info.pcie_generation = field<int>(d, "pcieGeneration", 0, where, notes);
        info.pcie_width = field<int>(d, "pcieWidth", 0, where, notes);
        info.compute_major = field<int>(d, "computeMajor", 0, where, notes);
        info.compute_minor = field<int>(d, "computeMinor", 0, where, notes);
        t.devices[field<int>(d, "id", 0, where, notes)] = info;
      }
    if (auto it = doc.find("gpulab"); it != doc.end() && it->is_object()) {
      t.dropped_records = field<int64_t>(*it, "dropped_records", 0, "gpulab", notes);
      t.um_counters_enabled = field<bool>(*it, "um_counters_enabled", false, "gpulab", notes);
    }
  }

  std::map<std::pair<int64_t, int64_t>, NvmlSample> samples;  // (time, device)
  for (size_t i = 0; i < events->size(); ++i) {
    const json& e = (*events)[i];
    if (!e.is_object()) {
      notes.add("trace event that is not an object, skipped", i, "");
      continue;
    }
    const auto ph_it = e.find("ph");
    const std::string ph = ph_it != e.end() && ph_it->is_string() ? ph_it->get<std::string>() : "";
    const std::string cat = canonical_category(e);
    const EventReader r(e, i, cat, notes);
    if (ph == "C" && cat == "gpulab_nvml") {
      const auto ts = r.time_ns("ts");
      const json* v = r.arg("value");
      if (!ts) continue;
      if (!v || !v->is_number()) {
        r.note("without a numeric \"value\", skipped");
        continue;
      }
      int64_t at = 0;
      if (__builtin_add_overflow(*ts, base, &at)) {
        r.note("with \"ts\" plus the base time out of range, skipped");
        continue;
      }
      const int device = int(r.top_int("pid", 0));
      NvmlSample& s = samples[{at, device}];
      s.time_ns = at;
      s.device = device;
      const std::string name = r.name();
      for (const auto& [counter, member] : kNvmlFields)
        if (name == counter) s.*member = v->get<double>();
      continue;
    }
    if (ph != "X") continue;
    if (cat == "kernel") {
      Kernel k;
      if (!r.fill(k, base)) continue;
      k.name = r.name();
      k.grid = r.arg_dim3("grid");
      k.block = r.arg_dim3("block");
      k.registers = int(r.arg_int("registers per thread", 0));
      k.shared_memory = r.arg_int("shared memory", 0);
      t.kernels.push_back(std::move(k));
    } else if (cat == "gpu_memcpy") {
      Memcpy m;
      if (!r.fill(m, base)) continue;
      if (!parse_memcpy_name(r.name(), m))
        r.note("named other than \"Memcpy HtoD (Pageable -> Device)\": direction or memory kinds unknown");
      m.bytes = r.arg_int("bytes", 0);
      t.memcpys.push_back(m);
    } else if (cat == "gpu_memset") {
      Memset m;
      if (!r.fill(m, base)) continue;
      m.dst = parse_memset_name(r.name());
      m.bytes = r.arg_int("bytes", 0);
      t.memsets.push_back(m);
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      ApiCall c;
      const auto s = r.span(base);
      if (!s) continue;
      std::tie(c.start_ns, c.end_ns) = *s;
      c.name = r.name();
      c.thread = r.top_int("tid", 0);
      c.correlation = r.arg_int("correlation", 0);
      c.driver = cat == "cuda_driver";
      t.api_calls.push_back(std::move(c));
    } else if (cat == "user_annotation" || cat == "gpu_user_annotation") {
      NvtxRange g;
      const auto s = r.span(base);
      if (!s) continue;
      std::tie(g.start_ns, g.end_ns) = *s;
      g.name = r.name();
      g.gpu = cat == "gpu_user_annotation";
      g.device = g.gpu ? int(r.arg_int("device", r.top_int("pid", 0))) : 0;
      g.thread = g.gpu ? r.arg_int("stream", r.top_int("tid", 0)) : r.top_int("tid", 0);
      if (const json* d = r.arg("domain"); d && d->is_string()) g.domain = d->get<std::string>();
      t.ranges.push_back(std::move(g));
    } else if (cat == "gpulab_um") {
      UmEvent u;
      const auto kind = parse_um_kind(r.name());
      if (!kind) {
        r.note("of an unknown unified-memory kind, skipped");
        continue;
      }
      const auto s = r.span(base);
      if (!s) continue;
      u.kind = *kind;
      std::tie(u.start_ns, u.end_ns) = *s;
      u.address = uint64_t(r.arg_int("address", 0));
      u.value = r.arg_int("value", 0);
      u.device = int(r.top_int("pid", 0));
      t.um_events.push_back(u);
    }
  }
  for (auto& [key, s] : samples) t.samples.push_back(s);
  note_missing_links(t, notes);
  t.notes = notes.lines();
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
  if (in.peek() == 0x1f) {  // gzip's magic 1f 8b: export_chrome_trace("x.json.gz") compresses
    in.get();
    if (in.peek() == 0x8b)
      throw core::InputError(path.string() + ": gzip-compressed; decompress it first (gunzip -k " + path.string() + ")");
    in.unget();
  }
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {  // a syntax error, or a number beyond double (1e99999)
    throw core::InputError(path.string() + ": not valid JSON (" + e.what() + ")");
  }
  return parse_chrome_trace(doc, path.string());
}

std::string chrome_trace_json(const Trace& t) {
  const int64_t origin = t.first_time_ns();

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
  for (const auto& r : t.ranges) {
    json args = json::object();
    if (!r.domain.empty()) args["domain"] = r.domain;
    if (r.gpu) {
      args["device"] = r.device;
      args["stream"] = r.thread;
    }
    x_event(r.gpu ? "gpu_user_annotation" : "user_annotation", r.name, r.gpu ? r.device : kHostPid, r.thread,
            r.start_ns, r.end_ns, std::move(args));
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
    props.push_back({{"id", id}, {"name", d.name}, {"numSms", d.sm_count}, {"computeMajor", d.compute_major},
                     {"computeMinor", d.compute_minor}, {"pcieGeneration", d.pcie_generation}, {"pcieWidth", d.pcie_width}});
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
