// The request line and headers of an HTTP request (what `gpulab serve` reads before the body):
// parsed or answered with an error status, never a crash; the error body is valid JSON.
#include <nlohmann/json.hpp>

#include "core/http_server.h"
#include "fuzz/fuzz_util.h"

using namespace gpulab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  core::HttpLimits limits;
  limits.max_body_bytes = 1 << 20;
  const core::HttpRequestHead head = core::parse_request_head(fuzz::as_text(data, size), limits);
  if (head.error_status) {
    fuzz::check(head.error_status >= 400 && head.error_status < 500, "errors are 4xx");
    fuzz::check(!nlohmann::json::parse(core::http_error_body(head.error), nullptr, false).is_discarded(),
                "the error body is JSON");
  } else {
    fuzz::check(!head.request.path.empty() && head.request.path[0] == '/', "the path starts with /");
    fuzz::check(head.body_bytes <= limits.max_body_bytes, "the body is within the limit");
    // What the server answers for an unknown route quotes the path: still JSON.
    fuzz::check(!nlohmann::json::parse(core::http_error_body("no route " + head.request.path), nullptr, false).is_discarded(),
                "a message quoting the path is JSON");
  }
  return 0;
}
