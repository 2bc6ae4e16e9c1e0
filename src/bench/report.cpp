#include "bench/report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "core/data_files.h"
#include "core/error.h"

namespace gpulab::bench {

using nlohmann::json;

namespace {

std::optional<double> number(const json& row, const char* key) {
  if (!row.contains(key) || !row[key].is_number()) return std::nullopt;
  return row[key].get<double>();
}

std::string fixed(double v) {
  char buf[64];
  const double a = std::abs(v);
  std::snprintf(buf, sizeof buf, a >= 100 ? "%.1f" : a >= 1 ? "%.2f" : a >= 0.01 ? "%.4f" : "%.3g", v);
  return buf;
}

}  // namespace

Datasheet datasheet_for(const json& accelerators, const std::string& device_name) {
  Datasheet d;
  for (const auto& row : accelerators) {
    bool hit = false;
    for (const auto& m : row.value("match", json::array()))
      hit = hit || device_name.find(m.get<std::string>()) != std::string::npos;
    if (!hit) continue;
    d.name = row.value("name", "");
    d.fp32_tflops = number(row, "fp32_tflops");
    d.tf32_tflops = number(row, "tf32_tflops");
    d.fp16_tflops = number(row, "fp16_tflops");
    d.bf16_tflops = number(row, "bf16_tflops");
    d.fp8_tflops = number(row, "fp8_tflops");
    if (auto tb = number(row, "memory_tbps")) d.memory_gbps = *tb * 1000;
    d.tdp_watts = number(row, "tdp_watts");
    break;
  }
  return d;
}

Datasheet load_datasheet(const std::string& device_name) {
  const auto path = core::data_file("accelerators.json");
  std::ifstream in(path);
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("accelerators"))
    throw core::Error(path.string() + ": not a valid accelerator table");
  return datasheet_for(j["accelerators"], device_name);
}

std::optional<double> gemm_peak(const Datasheet& d, const std::string& precision) {
  if (precision == "fp32") return d.fp32_tflops;
  if (precision == "tf32") return d.tf32_tflops;
  if (precision == "fp16") return d.fp16_tflops;
  if (precision == "bf16") return d.bf16_tflops;
  if (precision == "fp8e4m3") return d.fp8_tflops;
  return std::nullopt;
}

Row make_row(const std::string& suite, const std::string& name, const std::string& metric,
             const std::string& unit, const Summary& s, std::optional<double> peak, json params) {
  params["min"] = s.min;
  params["p10"] = s.p10;
  params["p90"] = s.p90;
  params["max"] = s.max;
  params["samples"] = s.count;
  Row row;
  row.result.suite = suite;
  row.result.name = name;
  row.result.metric = metric;
  row.result.unit = unit;
  row.result.value = s.median;
  row.result.peak = peak;
  row.result.params = std::move(params);
  return row;
}

std::string percent_of(double value, std::optional<double> peak) {
  if (!peak || *peak <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", 100.0 * value / *peak);
  return buf;
}

void render_table(std::ostream& out, const std::string& title, const std::vector<Row>& rows,
                  const std::vector<std::string>& notes) {
  std::vector<std::vector<std::string>> cells = {
      {"figure", "median", "unit", "p10 .. p90", "% peak", "% ceiling"}};
  for (const auto& row : rows) {
    const auto& r = row.result;
    std::string spread = "-";
    if (r.params.contains("p10") && r.params.contains("p90"))
      spread = fixed(r.params["p10"].get<double>()) + " .. " + fixed(r.params["p90"].get<double>());
    cells.push_back({r.name, fixed(r.value), r.unit, spread, percent_of(r.value, r.peak),
                     percent_of(r.value, row.ceiling)});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& line : cells)
    for (size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  out << "== " << title << " ==\n";
  for (size_t i = 0; i < cells.size(); ++i) {
    for (size_t c = 0; c < cells[i].size(); ++c) {
      const bool left = c == 0 || c == 2;  // names and units left, numbers right
      const std::string pad(width[c] - cells[i][c].size(), ' ');
      out << (c ? "  " : "") << (left ? cells[i][c] + pad : pad + cells[i][c]);
    }
    out << "\n";
  }
  for (const auto& n : notes) out << "  note: " << n << "\n";
  out << "\n";
}

}  // namespace gpulab::bench
