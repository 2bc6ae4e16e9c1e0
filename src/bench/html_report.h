// A self-contained HTML page (inline SVG, no scripts) from bench results in the JSON schema:
// the measured roofline (GEMM points over arithmetic intensity beside the measured HBM
// bandwidth line and the best measured compute rate of each precision), one bar chart per suite,
// and the full table. Works on a live run or on saved result files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace gpulab::bench {

// `results` is an array of result objects (core::to_json(Result, GpuStamp)).
std::string render_html(const nlohmann::json& results, const std::string& title);

// Escapes &, <, >, " and ' for HTML text and attribute values.
std::string html_escape(const std::string& text);

}  // namespace gpulab::bench
