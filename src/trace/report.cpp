#include "trace/report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace gpulab::trace {

using nlohmann::json;

namespace {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Evidence values on one line: numbers as they are, offender lists as "name ×count (ms)".
std::string evidence_text(const json& v) {
  if (v.is_array() && !v.empty() && v[0].is_object() && v[0].contains("name")) {
    std::string s;
    for (const auto& o : v)
      s += (s.empty() ? "" : "; ") + o["name"].get<std::string>() + " x" + std::to_string(o["count"].get<int64_t>()) +
           " (" + fixed(o["total_ms"].get<double>(), 3) + " ms)";
    return s;
  }
  return v.dump();
}

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

struct Span {
  int64_t start = 0, end = 0;
};

Span gpu_span(const Trace& t) {
  Span s{INT64_MAX, INT64_MIN};
  const auto see = [&](const GpuActivity& a) {
    s.start = std::min(s.start, a.start_ns);
    s.end = std::max(s.end, a.end_ns);
  };
  for (const auto& k : t.kernels) see(k);
  for (const auto& m : t.memcpys) see(m);
  for (const auto& m : t.memsets) see(m);
  if (s.start > s.end) return {0, 1};
  if (s.end == s.start) ++s.end;
  return s;
}

// Busy share per time bin (any kernel, copy or memset running), as an SVG area plot.
std::string utilization_svg(const Trace& t, Span span) {
  constexpr int kBins = 300, kWidth = 900, kHeight = 160;
  std::vector<std::pair<int64_t, int64_t>> iv;
  for (const auto& k : t.kernels) iv.push_back({k.start_ns, k.end_ns});
  for (const auto& m : t.memcpys) iv.push_back({m.start_ns, m.end_ns});
  for (const auto& m : t.memsets) iv.push_back({m.start_ns, m.end_ns});
  std::sort(iv.begin(), iv.end());
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (const auto& i : iv)
    if (!busy.empty() && i.first <= busy.back().second) busy.back().second = std::max(busy.back().second, i.second);
    else busy.push_back(i);
  std::vector<double> bins(kBins, 0);
  const double bin_ns = double(span.end - span.start) / kBins;
  for (const auto& [a, b] : busy)
    for (int i = std::max(0, int((a - span.start) / bin_ns)); i < kBins && span.start + i * bin_ns < b; ++i) {
      const double lo = std::max(double(a), span.start + i * bin_ns), hi = std::min(double(b), span.start + (i + 1) * bin_ns);
      if (hi > lo) bins[i] += (hi - lo) / bin_ns;
    }
  std::ostringstream s;
  s << "<svg width=\"" << kWidth << "\" height=\"" << kHeight + 20 << "\" xmlns=\"http://www.w3.org/2000/svg\">"
    << "<rect width=\"" << kWidth << "\" height=\"" << kHeight << "\" fill=\"#f4f4f4\"/><polygon fill=\"#4878d0\" points=\"0," << kHeight;
  for (int i = 0; i < kBins; ++i)
    s << " " << fixed(double(i) * kWidth / kBins, 1) << "," << fixed(kHeight * (1 - std::min(1.0, bins[i])), 1) << " "
      << fixed(double(i + 1) * kWidth / kBins, 1) << "," << fixed(kHeight * (1 - std::min(1.0, bins[i])), 1);
  s << " " << kWidth << "," << kHeight << "\"/><text x=\"0\" y=\"" << kHeight + 15 << "\" font-size=\"11\">0 ms</text>"
    << "<text x=\"" << kWidth << "\" y=\"" << kHeight + 15 << "\" font-size=\"11\" text-anchor=\"end\">"
    << fixed((span.end - span.start) / 1e6, 1) << " ms</text></svg>";
  return s.str();
}

// One row per (device, stream); kernels blue, copies orange, memsets green.
std::string timeline_svg(const Trace& t, Span span) {
  constexpr int kWidth = 900, kRow = 18, kLabel = 110;
  constexpr size_t kMaxRects = 50000;  // keeps the page openable; later records are left out
  std::map<std::pair<int, int64_t>, int> rows;
  const auto row = [&](const GpuActivity& a) { return rows.emplace(std::pair{a.device, a.stream}, 0).first; };
  for (const auto& k : t.kernels) row(k);
  for (const auto& m : t.memcpys) row(m);
  for (const auto& m : t.memsets) row(m);
  int index = 0;
  for (auto& [key, r] : rows) r = index++;
  const double scale = double(kWidth - kLabel) / double(span.end - span.start);
  std::ostringstream s;
  s << "<svg width=\"" << kWidth << "\" height=\"" << rows.size() * kRow + 4 << "\" xmlns=\"http://www.w3.org/2000/svg\">";
  for (const auto& [key, r] : rows)
    s << "<text x=\"0\" y=\"" << r * kRow + 13 << "\" font-size=\"11\">GPU " << key.first << " stream " << key.second << "</text>";
  size_t drawn = 0;
  const auto rect = [&](const GpuActivity& a, const char* color, const std::string& title) {
    if (drawn++ >= kMaxRects) return;
    const double x = kLabel + (a.start_ns - span.start) * scale, w = std::max(0.5, a.duration_ns() * scale);
    s << "<rect x=\"" << fixed(x, 2) << "\" y=\"" << rows[{a.device, a.stream}] * kRow + 2 << "\" width=\"" << fixed(w, 2)
      << "\" height=\"" << kRow - 4 << "\" fill=\"" << color << "\"><title>" << escape_html(title) << "</title></rect>";
  };
  for (const auto& k : t.kernels) rect(k, "#4878d0", k.name);
  for (const auto& m : t.memcpys) rect(m, "#ee854a", "Memcpy " + std::string(copy_kind_name(m.kind)) + " " + std::to_string(m.bytes) + " B");
  for (const auto& m : t.memsets) rect(m, "#6acc64", "Memset " + std::to_string(m.bytes) + " B");
  s << "</svg>";
  return s.str();
}

}  // namespace

void print_report(std::ostream& out, const Report& report) {
  const json& s = report.summary;
  out << "gpulab diagnose: " << s.value("source", std::string()) << "\n"
      << "  GPU span " << fixed(s.value("span_ms", 0.0), 3) << " ms, busy " << fixed(s.value("gpu_busy_ms", 0.0), 3)
      << " ms (" << fixed(s.value("gpu_busy_percent", 0.0), 1) << "%); " << s.value("kernels", 0) << " kernels, "
      << s.value("memcpys", 0) << " copies, " << s.value("memsets", 0) << " memsets, " << s.value("api_calls", 0)
      << " API calls\n";
  if (const auto w = s.find("window"); w != s.end())
    out << "  analysed window (--capture-range " << w->value("capture_range", std::string()) << "): "
        << fixed(w->value("start_ms", 0.0), 3) << " to " << fixed(w->value("end_ms", 0.0), 3)
        << " ms of the trace, first start to last end of " << w->value("occurrences", int64_t(0))
        << " ranges of that name\n";
  if (s.value("dropped_records", int64_t(0)) > 0)
    out << "  warning: CUPTI dropped " << s["dropped_records"].get<int64_t>()
        << " records; the figures below undercount\n";
  if (const auto notes = s.find("notes"); notes != s.end())
    for (const json& n : *notes) out << "  note: " << n.get<std::string>() << "\n";
  if (const auto top = s.find("top_kernels"); top != s.end() && !top->empty()) {
    out << "  top kernels by GPU time:\n";
    for (const json& k : *top)
      out << "    " << fixed(k.value("percent_of_kernel_time", 0.0), 1) << "%  " << fixed(k.value("total_ms", 0.0), 3)
          << " ms  " << k.value("count", int64_t(0)) << " x " << fixed(k.value("mean_us", 0.0), 1) << " us  "
          << utf8_prefix(k.value("name", std::string()), 100) << "\n";
  }
  if (report.findings.empty()) {
    out << "\nNo findings: the GPU was kept busy.\n";
    return;
  }
  out << "\n";
  int rank = 1;
  for (const auto& f : report.findings) {
    out << rank++ << ". [" << severity_name(f.severity) << "] " << f.rule << ": ~" << fixed(f.time_lost_ms, 3)
        << " ms lost — " << f.summary << "\n";
    for (const auto& [key, value] : f.evidence.items()) out << "     " << key << ": " << evidence_text(value) << "\n";
    out << "   fix: " << f.fix << "\n\n";
  }
}

std::string report_html(const Trace& trace, const Report& report) {
  const Span span = gpu_span(trace);
  std::ostringstream h;
  h << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>gpulab diagnose</title><style>"
       "body{font-family:sans-serif;margin:2em;max-width:960px}td,th{border-bottom:1px solid #ddd;padding:4px;"
       "text-align:left;vertical-align:top}table{border-collapse:collapse}.high{color:#b00}.medium{color:#b60}"
       "pre{white-space:pre-wrap;font-size:12px}</style></head><body><h1>gpulab diagnose</h1><p>"
    << escape_html(report.summary.value("source", std::string())) << "</p><pre>" << escape_html(report.summary.dump(2))
    << "</pre><h2>Findings</h2><table><tr><th>rule</th><th>severity</th><th>time lost (ms)</th><th>what</th><th>fix</th></tr>";
  for (const auto& f : report.findings)
    h << "<tr><td>" << f.rule << "</td><td class=\"" << severity_name(f.severity) << "\">" << severity_name(f.severity)
      << "</td><td>" << fixed(f.time_lost_ms, 3) << "</td><td>" << escape_html(f.summary) << "<pre>"
      << escape_html(f.evidence.dump(1)) << "</pre></td><td>" << escape_html(f.fix) << "</td></tr>";
  h << "</table><h2>GPU busy over time</h2>" << utilization_svg(trace, span) << "<h2>Per-stream timeline</h2>"
    << timeline_svg(trace, span) << "</body></html>\n";
  return h.str();
}

}  // namespace gpulab::trace
