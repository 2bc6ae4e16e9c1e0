// Rendering a diagnosis for people: a terminal summary and a self-contained HTML page with
// utilization-over-time and per-stream timeline SVGs.
#pragma once

#include <ostream>
#include <string>

#include "trace/rules.h"
#include "trace/trace.h"

namespace gpulab::trace {

// Findings ranked by time lost, each with its evidence and fix; then the trace summary.
void print_report(std::ostream& out, const Report& report);

// One HTML document (no external resources).
std::string report_html(const Trace& trace, const Report& report);

}  // namespace gpulab::trace
