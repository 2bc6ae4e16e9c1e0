// Column-aligned text tables for the terminal.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace gpulab::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

std::string human_bytes(uint64_t bytes);      // "13.48 GB" (powers of 1000)
std::string human_gib(uint64_t bytes);        // "139.8 GiB" (powers of 1024), as nvidia-smi counts
std::string human_count(uint64_t n);          // "6.74 B"
std::string format_double(double v, int precision);

}  // namespace gpulab::cli
