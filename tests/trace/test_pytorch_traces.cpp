// Traces written by torch.profiler for the programs in examples/pytorch/ (recorded on a GPU by
// scripts/pytorch_traces.sh, committed under tests/data/traces/pytorch/): each parses cleanly and
// gives the finding tests/data/traces/pytorch/expected.json names.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

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

// Every program in examples/pytorch/ is run by scripts/pytorch_traces.sh and has an expectation.
TEST(PytorchTraces, EveryProgramHasAnExpectationAndIsRun) {
  const fs::path root = fs::path(GPULAB_TEST_DATA).parent_path().parent_path();
  std::ifstream expected_file(root / "tests" / "data" / "traces" / "pytorch" / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(expected_file);
  std::ifstream script_file(root / "scripts" / "pytorch_traces.sh");
  std::string script((std::istreambuf_iterator<char>(script_file)), std::istreambuf_iterator<char>());
  const auto start = script.find("\nprograms=(");
  ASSERT_NE(start, std::string::npos);
  const std::string programs = " " + script.substr(start + 11, script.find(')', start) - start - 11) + " ";
  int count = 0;
  for (const auto& e : fs::directory_iterator(root / "examples" / "pytorch")) {
    const std::string name = e.path().stem().string();
    if (e.path().extension() != ".py" || name == "common") continue;
    ++count;
    EXPECT_TRUE(expected.contains(name + ".json")) << name;
    EXPECT_NE(programs.find(" " + name + " "), std::string::npos) << name << " is not in the script's programs";
  }
  EXPECT_EQ(count, 8);
  EXPECT_EQ(expected.size(), size_t(count));
}
