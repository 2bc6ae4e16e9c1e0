// Kineto / Chrome-trace JSON of arbitrary bytes, as `gpulab diagnose --trace` reads it: parsed or
// refused with an InputError; a parsed trace written back as Chrome-trace JSON parses again to as
// many records, and the analysis runs on it to the end: the rules, the text, JSON and HTML
// reports, and --capture-range's window over the trace's first NVTX range.
#include <nlohmann/json.hpp>
#include <sstream>

#include "fuzz/fuzz_util.h"
#include "trace/chrome_trace.h"
#include "trace/report.h"
#include "trace/rules.h"
#include "trace/window.h"

using namespace gpulab;

namespace {

void analyze_and_report(const trace::Trace& t) {
  const trace::Report report = trace::analyze(t);
  std::ostringstream text;
  trace::print_report(text, report);
  (void)trace::report_json(report).dump(2);  // throws on a string that is not UTF-8
  (void)trace::report_html(t, report);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json doc = nlohmann::json::parse(fuzz::as_text(data, size), nullptr, false);
  if (doc.is_discarded()) return 0;
  fuzz::refuse_or_pass([&] {
    const trace::Trace t = trace::parse_chrome_trace(doc, "trace.json");
    const std::string text = trace::chrome_trace_json(t);
    const trace::Trace again = trace::parse_chrome_trace(nlohmann::json::parse(text), "rewritten");
    fuzz::check(again.kernels.size() == t.kernels.size(), "a written trace reads back with its kernels");
    analyze_and_report(t);
    if (!t.ranges.empty()) analyze_and_report(trace::clip_to_window(t, trace::capture_window(t, t.ranges.front().name)));
  });
  return 0;
}
