// What a suite produces: rows of figures (each a core::Result with its spread), rendered as one
// terminal table per suite and collected into the run's JSON log. Plain C++, so CPU tests cover it.
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/stats.h"
#include "core/result.h"

namespace gpulab::bench {

// Datasheet peaks of the GPU under test, from data/accelerators.json (missing = not published).
struct Datasheet {
  std::string name;  // the table's row name ("H200 SXM"), "" when the GPU is not in the table
  std::optional<double> fp32_tflops, tf32_tflops, fp16_tflops, bf16_tflops, fp8_tflops;
  std::optional<double> memory_gbps;  // GB/s (the table gives TB/s)
  std::optional<double> tdp_watts;
};

// The row of `accelerators` (the "accelerators" array) whose "match" strings occur in `device_name`.
Datasheet datasheet_for(const nlohmann::json& accelerators, const std::string& device_name);
// Same, reading the bundled table (core::data_file).
Datasheet load_datasheet(const std::string& device_name);
// Datasheet peak for a GEMM precision name ("fp32", "tf32", "fp16", "bf16", "fp8e4m3").
std::optional<double> gemm_peak(const Datasheet& d, const std::string& precision);

struct Row {
  core::Result result;              // value is the median; params carry the spread
  std::optional<double> ceiling;    // the measured ceiling in the same unit, when one exists
};

// Builds a row from a summary of samples already converted to the figure's unit; the spread
// (min, p10, p90, max, count) goes into params.
Row make_row(const std::string& suite, const std::string& name, const std::string& metric,
             const std::string& unit, const Summary& s, std::optional<double> peak,
             nlohmann::json params = nlohmann::json::object());

// One table: figure, median, spread p10..p90, % of datasheet peak, % of measured ceiling.
void render_table(std::ostream& out, const std::string& title, const std::vector<Row>& rows,
                  const std::vector<std::string>& notes);
// "12.3" for a fraction 0.123 of a peak; "-" when either side is missing.
std::string percent_of(double value, std::optional<double> peak);

}  // namespace gpulab::bench
