// Kineto / Chrome-trace JSON of arbitrary bytes: parsed or refused with an InputError; a parsed
// trace written back as Chrome-trace JSON parses again to as many records.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "trace/chrome_trace.h"

using namespace gpulab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json doc = nlohmann::json::parse(fuzz::as_text(data, size), nullptr, false);
  if (doc.is_discarded()) return 0;
  fuzz::refuse_or_pass([&] {
    const trace::Trace t = trace::parse_chrome_trace(doc, "trace.json");
    const std::string text = trace::chrome_trace_json(t);
    const trace::Trace again = trace::parse_chrome_trace(nlohmann::json::parse(text), "rewritten");
    fuzz::check(again.kernels.size() == t.kernels.size(), "a written trace reads back with its kernels");
  });
  return 0;
}
