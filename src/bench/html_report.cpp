#include "bench/html_report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <vector>

#include "core/dtype.h"

namespace gpulab::bench {

using nlohmann::json;

namespace {

constexpr double kWidth = 720, kHeight = 420, kMargin = 60;

std::string num(double v, int precision = 3) {
  std::ostringstream out;
  out.precision(precision);
  out << v;
  return out.str();
}

// Bytes per element of a precision named in a GEMM result's params ("bf16", "fp8e4m3", "tf32").
double element_bytes(const std::string& name) {
  if (name == "tf32") return 4;
  if (auto dt = core::dtype_from_name(name)) return static_cast<double>(core::dtype_size(*dt));
  return 4;
}

struct Point {
  std::string name, precision;
  double intensity, tflops;
};

// GEMM points: FLOPs 2mnk over the fewest bytes (A and B read once, C written once).
std::vector<Point> gemm_points(const json& results) {
  std::vector<Point> points;
  for (const auto& r : results) {
    if (r.value("suite", "") != "gemm" || r.value("unit", "") != "TFLOP/s") continue;
    const json& p = r["params"];
    if (!p.contains("m") || !p.contains("n") || !p.contains("k")) continue;
    const double m = p["m"].get<double>(), n = p["n"].get<double>(), k = p["k"].get<double>();
    const std::string in = p.value("input", p.value("precision", "fp32"));
    const std::string out = p.value("output", "fp32");
    const double bytes = (m * k + k * n) * element_bytes(in) + m * n * element_bytes(out);
    points.push_back({r["name"], p.value("precision", in), 2 * m * n * k / bytes, r["value"].get<double>()});
  }
  return points;
}

std::optional<double> hbm_bandwidth_gbps(const json& results) {
  std::optional<double> best;
  for (const auto& r : results)
    if (r.value("suite", "") == "memory" && r.value("name", "").rfind("hbm_copy", 0) == 0)
      best = std::max(best.value_or(0.0), r["value"].get<double>());
  return best;
}

std::string roofline_svg(const json& results) {
  const auto points = gemm_points(results);
  const auto bandwidth = hbm_bandwidth_gbps(results);
  if (points.empty()) return "<p>No GEMM figures in these results: no roofline.</p>";
  // Log axes spanning every point and the ridge.
  double x_lo = 1, x_hi = 10, y_lo = 1, y_hi = 10;
  for (const auto& p : points) {
    x_lo = std::min(x_lo, p.intensity / 2), x_hi = std::max(x_hi, p.intensity * 2);
    y_lo = std::min(y_lo, p.tflops / 2), y_hi = std::max(y_hi, p.tflops * 2);
  }
  x_lo = std::pow(10, std::floor(std::log10(x_lo))), x_hi = std::pow(10, std::ceil(std::log10(x_hi)));
  y_lo = std::pow(10, std::floor(std::log10(y_lo))), y_hi = std::pow(10, std::ceil(std::log10(y_hi)));
  auto sx = [&](double x) { return kMargin + (std::log10(x) - std::log10(x_lo)) / (std::log10(x_hi) - std::log10(x_lo)) * (kWidth - 2 * kMargin); };
  auto sy = [&](double y) { return kHeight - kMargin - (std::log10(y) - std::log10(y_lo)) / (std::log10(y_hi) - std::log10(y_lo)) * (kHeight - 2 * kMargin); };

  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << kWidth << "' height='" << kHeight
      << "' class='roofline'><rect width='100%' height='100%' fill='white'/>";
  for (double x = x_lo; x <= x_hi * 1.001; x *= 10)
    svg << "<line x1='" << sx(x) << "' y1='" << sy(y_lo) << "' x2='" << sx(x) << "' y2='" << sy(y_hi)
        << "' stroke='#ddd'/><text x='" << sx(x) << "' y='" << kHeight - kMargin + 16 << "' font-size='11' text-anchor='middle'>" << num(x) << "</text>";
  for (double y = y_lo; y <= y_hi * 1.001; y *= 10)
    svg << "<line x1='" << sx(x_lo) << "' y1='" << sy(y) << "' x2='" << sx(x_hi) << "' y2='" << sy(y)
        << "' stroke='#ddd'/><text x='" << kMargin - 6 << "' y='" << sy(y) + 4 << "' font-size='11' text-anchor='end'>" << num(y) << "</text>";
  svg << "<text x='" << kWidth / 2 << "' y='" << kHeight - 12 << "' font-size='12' text-anchor='middle'>arithmetic intensity (FLOP per byte of A, B and C)</text>"
      << "<text x='14' y='" << kHeight / 2 << "' font-size='12' transform='rotate(-90 14 " << kHeight / 2 << ")' text-anchor='middle'>TFLOP/s</text>";
  // The bandwidth line: TFLOP/s = GB/s × FLOP/byte / 1000, up to the best compute rate.
  if (bandwidth) {
    std::map<std::string, double> best;
    for (const auto& p : points) best[p.precision] = std::max(best[p.precision], p.tflops);
    const double top = std::max_element(best.begin(), best.end(), [](auto& a, auto& b) { return a.second < b.second; })->second;
    const double ridge = top * 1000 / *bandwidth;
    const double start = std::max(x_lo, y_lo * 1000 / *bandwidth);
    svg << "<polyline class='bandwidth' fill='none' stroke='#c33' stroke-width='2' points='" << sx(start) << ","
        << sy(*bandwidth * start / 1000) << " " << sx(std::min(ridge, x_hi)) << "," << sy(std::min(top, *bandwidth * x_hi / 1000)) << "'/>"
        << "<text x='" << sx(start) + 4 << "' y='" << sy(*bandwidth * start / 1000) - 6 << "' font-size='11' fill='#c33'>HBM "
        << num(*bandwidth / 1000) << " TB/s (measured)</text>";
    for (const auto& [precision, rate] : best)
      svg << "<line class='ceiling' x1='" << sx(std::min(rate * 1000 / *bandwidth, x_hi)) << "' y1='" << sy(rate) << "' x2='" << sx(x_hi)
          << "' y2='" << sy(rate) << "' stroke='#888' stroke-dasharray='4 3'/><text x='" << sx(x_hi) - 4 << "' y='" << sy(rate) - 4
          << "' font-size='11' text-anchor='end'>" << html_escape(precision) << " " << num(rate) << "</text>";
  }
  static const char* kColours[] = {"#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
  std::map<std::string, int> colour;
  for (const auto& p : points) {
    const int c = colour.emplace(p.precision, static_cast<int>(colour.size()) % 7).first->second;
    svg << "<circle class='gemm' cx='" << sx(p.intensity) << "' cy='" << sy(p.tflops) << "' r='4' fill='" << kColours[c]
        << "'><title>" << html_escape(p.name) << ": " << num(p.tflops, 4) << " TFLOP/s at " << num(p.intensity, 4)
        << " FLOP/B</title></circle>";
  }
  svg << "</svg>";
  return svg.str();
}

// Horizontal bars, one per figure of a suite, grouped by unit (bars of different units do not share a scale).
std::string suite_bars(const std::vector<json>& rows) {
  std::map<std::string, std::vector<const json*>> by_unit;
  for (const auto& r : rows) by_unit[r.value("unit", "")].push_back(&r);
  std::ostringstream out;
  for (const auto& [unit, list] : by_unit) {
    double top = 0;
    for (const json* r : list) top = std::max(top, (*r)["value"].get<double>());
    const double bar_h = 18, label_w = 300, chart_w = 360, height = bar_h * list.size() + 10;
    out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << label_w + chart_w + 120 << "' height='" << height << "' class='bars'>";
    for (size_t i = 0; i < list.size(); ++i) {
      const json& r = *list[i];
      const double v = r["value"].get<double>(), w = top > 0 ? v / top * chart_w : 0, y = i * bar_h + 4;
      out << "<text x='" << label_w - 6 << "' y='" << y + 12 << "' font-size='11' text-anchor='end'>" << html_escape(r["name"])
          << "</text><rect x='" << label_w << "' y='" << y << "' width='" << w << "' height='" << bar_h - 4
          << "' fill='#4a7fb5'/><text x='" << label_w + w + 4 << "' y='" << y + 12 << "' font-size='11'>" << num(v, 4) << " "
          << html_escape(unit) << "</text>";
    }
    out << "</svg>";
  }
  return out.str();
}

}  // namespace

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string render_html(const json& results, const std::string& title) {
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>" << html_escape(title)
       << "</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:2px 8px;font-size:12px}td.n{text-align:right}</style></head><body>\n";
  html << "<h1>" << html_escape(title) << "</h1>\n";
  if (!results.empty() && results[0].contains("gpu")) {
    const json& gpu = results[0]["gpu"];
    html << "<p>" << html_escape(gpu.value("name", "")) << ", driver " << html_escape(gpu.value("driver", "")) << ", git "
         << html_escape(results[0].value("git", "")) << ", " << html_escape(results[0].value("time", "")) << "</p>\n";
  }
  html << "<h2>Roofline</h2>\n" << roofline_svg(results) << "\n";
  std::map<std::string, std::vector<json>> by_suite;
  std::vector<std::string> order;
  for (const auto& r : results) {
    const std::string suite = r.value("suite", "");
    if (!by_suite.count(suite)) order.push_back(suite);
    by_suite[suite].push_back(r);
  }
  for (const auto& suite : order) html << "<h2>" << html_escape(suite) << "</h2>\n" << suite_bars(by_suite[suite]) << "\n";
  html << "<h2>All figures</h2>\n<table><tr><th>suite</th><th>figure</th><th>value</th><th>unit</th><th>% of peak</th></tr>\n";
  for (const auto& r : results) {
    const bool has_fraction = r.contains("fraction") && r["fraction"].is_number();
    html << "<tr><td>" << html_escape(r.value("suite", "")) << "</td><td>" << html_escape(r.value("name", ""))
         << "</td><td class='n'>" << num(r["value"].get<double>(), 5) << "</td><td>" << html_escape(r.value("unit", ""))
         << "</td><td class='n'>" << (has_fraction ? num(100 * r["fraction"].get<double>(), 3) : "-") << "</td></tr>\n";
  }
  html << "</table>\n</body></html>\n";
  return html.str();
}

}  // namespace gpulab::bench
