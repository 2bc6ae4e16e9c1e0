#include "cli/table.h"

#include <algorithm>
#include <cstdio>

namespace gpulab::cli {

void Table::print(std::ostream& out) const {
  std::vector<size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) width[i] = std::max(width[i], row[i].size());
  };
  measure(header_);
  for (const auto& r : rows_) measure(r);
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < width.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      line += cell;
      if (i + 1 < width.size()) line += std::string(width[i] - cell.size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };
  emit(header_);
  std::vector<std::string> rule;
  for (size_t w : width) rule.emplace_back(w, '-');
  emit(rule);
  for (const auto& r : rows_) emit(r);
}

static std::string scaled(double v, const char* const* units, int n_units, const char* space) {
  int u = 0;
  while (v >= 1000.0 && u + 1 < n_units) {
    v /= 1000.0;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s%s" : "%.2f%s%s", v, space, units[u]);
  return buf;
}

std::string human_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  return scaled(static_cast<double>(bytes), kUnits, 5, " ");
}

std::string human_gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

std::string human_count(uint64_t n) {
  static const char* kUnits[] = {"", "K", "M", "B", "T"};
  return scaled(static_cast<double>(n), kUnits, 5, n >= 1000 ? " " : "");
}

std::string format_double(double v, int precision) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

}  // namespace gpulab::cli
