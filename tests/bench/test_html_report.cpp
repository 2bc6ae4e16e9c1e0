// The HTML report from result JSON: a roofline with one point per GEMM figure under the
// measured bandwidth line, bar charts per suite, escaped text.
#include <gtest/gtest.h>

#include "bench/html_report.h"
#include "core/result.h"

using namespace gpulab;
using nlohmann::json;

namespace {

json result(const std::string& suite, const std::string& name, double value, const std::string& unit, json params) {
  return core::to_json(core::Result{suite, name, "throughput", value, unit, std::nullopt, params},
                       core::GpuStamp{"NVIDIA H200", 1980, 3201, "580"});
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = 0; (pos = text.find(what, pos)) != std::string::npos; pos += what.size()) ++n;
  return n;
}

}  // namespace

TEST(HtmlReport, RooflineHasEveryGemmPointAndTheBandwidthLine) {
  json results = json::array();
  results.push_back(result("memory", "hbm_copy_memcpy_d2d", 4200, "GB/s", json::object()));
  results.push_back(result("gemm", "cublaslt_bf16_8192", 753, "TFLOP/s",
                           {{"m", 8192}, {"n", 8192}, {"k", 8192}, {"input", "bf16"}, {"output", "bf16"}, {"precision", "bf16"}}));
  results.push_back(result("gemm", "ladder1_naive_fp32_4096", 5.3, "TFLOP/s",
                           {{"m", 4096}, {"n", 4096}, {"k", 4096}, {"input", "fp32"}, {"output", "fp32"}, {"precision", "fp32"}}));
  results.push_back(result("launch", "graph_per_node", 0.68, "us", json::object()));
  const std::string html = bench::render_html(results, "run <1>");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_EQ(count(html, "class='gemm'"), 2u);       // one point per GEMM figure
  EXPECT_EQ(count(html, "class='bandwidth'"), 1u);  // the measured HBM line
  EXPECT_EQ(count(html, "class='ceiling'"), 2u);    // best rate per precision
  EXPECT_NE(html.find("HBM 4.2 TB/s"), std::string::npos);
  EXPECT_NE(html.find("run &lt;1&gt;"), std::string::npos);  // escaped
  EXPECT_EQ(html.find("run <1>"), std::string::npos);
  EXPECT_EQ(count(html, "<h2>"), 5u);  // roofline, memory, gemm, launch, all figures
  EXPECT_NE(html.find("graph_per_node"), std::string::npos);
}

TEST(HtmlReport, WithoutGemmFiguresSaysSo) {
  json results = json::array({result("launch", "x", 1, "us", json::object())});
  EXPECT_NE(bench::render_html(results, "t").find("no roofline"), std::string::npos);
}

TEST(HtmlReport, EscapesEverySpecialCharacter) {
  EXPECT_EQ(bench::html_escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
}
