// Traces written by torch.profiler for the programs in examples/pytorch/ (recorded on a GPU by
// scripts/pytorch_traces.sh, committed under tests/data/traces/pytorch/): each parses cleanly and
// gives the finding tests/data/traces/pytorch/expected.json names.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trace/chrome_trace.h"
#include "trace/rules.h"
#include "trace/synthetic.h"

using namespace gpulab::trace;
namespace fs = std::filesystem;

TEST(PytorchTraces, PlantedRuleIsTheTopFinding) {
  const fs::path dir = fs::path(GPULAB_TEST_DATA) / "traces" / "pytorch";
  std::ifstream expected_file(dir / "expected.json");
  ASSERT_TRUE(expected_file) << dir / "expected.json";
  const nlohmann::json expected = nlohmann::json::parse(expected_file);
  std::vector<fs::path> traces;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json" && e.path().filename() != "expected.json") traces.push_back(e.path());
  std::sort(traces.begin(), traces.end());
  if (traces.empty())
    GTEST_SKIP() << "no PyTorch traces in " << dir.string()
                 << " yet: run scripts/pytorch_traces.sh on a GPU machine and copy $OUT/traces/*.json there";

  // One file's checks; an ASSERT ends that file's, not the others'.
  const auto check = [&](const fs::path& path) {
    const std::string file = path.filename().string();
    ASSERT_TRUE(expected.contains(file)) << "add " << file << " to " << (dir / "expected.json").string();
    const nlohmann::json& want = expected[file];
    const Trace t = read_chrome_trace(path);
    // The reader understood every event of the profiler's real output.
    for (const auto& note : t.notes)
      EXPECT_TRUE(note.find("skipped") == std::string::npos && note.find("ignored") == std::string::npos &&
                  note.find("unknown") == std::string::npos && note.find("no CUDA runtime") == std::string::npos)
          << note;
    EXPECT_GT(t.kernels.size(), 0u);
    EXPECT_GT(t.api_calls.size(), 0u);
    if (want.contains("parse_only")) return;

    const Report r = analyze(t);
    if (want.contains("top")) {
      const std::string rule = want["top"].get<std::string>();
      ASSERT_FALSE(r.findings.empty()) << "expected " << rule;
      EXPECT_EQ(r.findings[0].rule, rule) << gpulab::trace::testing::rules_text(r) << "\n" << report_json(r).dump(1);
      EXPECT_NE(r.findings[0].severity, Severity::low) << gpulab::trace::testing::rules_text(r);
    }
    if (want.value("nothing_high", false))
      for (const auto& f : r.findings)
        EXPECT_NE(f.severity, Severity::high) << f.rule << ": " << f.summary << "\n" << f.evidence.dump(1);
  };
  for (const auto& path : traces) {
    SCOPED_TRACE(path.filename().string());
    check(path);
  }
}
