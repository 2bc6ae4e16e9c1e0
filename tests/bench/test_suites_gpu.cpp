// Each suite's quick pass on a real GPU: it runs, its rows are positive numbers that validate
// against the result schema, and the verification inside it did not fail.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <sstream>

#include "bench/suite.h"
#include "common/gpu.h"
#include "core/error.h"

using namespace gpulab;
using namespace gpulab::bench;

namespace {

std::string run_quick(const std::string& suite, nlohmann::json& results) {
  Options opt;
  opt.quick = true;
  const auto device = core::query_device(0);
  std::ostringstream out;
  Context ctx(opt, device, load_datasheet(device.name), out);
  select_suites({suite}).at(0)->run(ctx);
  results = ctx.log().results();
  return out.str();
}

void expect_sane(const std::string& suite, size_t min_rows) {
  nlohmann::json results;
  const std::string table = run_quick(suite, results);
  EXPECT_EQ(table.find("FAILED"), std::string::npos) << table;
  EXPECT_GE(results.size(), min_rows) << table;
  for (const auto& r : results) {
    EXPECT_EQ(core::validate_result(r), "") << r.dump();
    EXPECT_EQ(r["suite"], suite);
    EXPECT_GT(r["value"].get<double>(), 0) << r.dump();
    EXPECT_TRUE(std::isfinite(r["value"].get<double>())) << r.dump();
  }
  std::cout << table;
}

}  // namespace

TEST(SuitesGpu, Memory) { GPULAB_REQUIRE_GPU(); expect_sane("memory", 8); }

// Each level's chase must reach that level: L1 < L2 < HBM, with clear gaps (an HBM chase that
// revisits lines it already pulled into L2 reports the L2's latency).
TEST(SuitesGpu, LatencyLevelsAreOrdered) {
  GPULAB_REQUIRE_GPU();
  nlohmann::json results;
  const std::string table = run_quick("memory", results);
  std::map<std::string, double> ns;
  for (const auto& r : results) ns[r["name"].get<std::string>()] = r["value"].get<double>();
  ASSERT_TRUE(ns.count("latency_l1") && ns.count("latency_l2") && ns.count("latency_hbm")) << table;
  EXPECT_GT(ns["latency_l2"], 2 * ns["latency_l1"]) << table;
  EXPECT_GT(ns["latency_hbm"], 1.3 * ns["latency_l2"]) << table;
}
TEST(SuitesGpu, Transfer) { GPULAB_REQUIRE_GPU(); expect_sane("transfer", 15); }
TEST(SuitesGpu, Launch) { GPULAB_REQUIRE_GPU(); expect_sane("launch", 4); }
TEST(SuitesGpu, Gemm) { GPULAB_REQUIRE_GPU(); expect_sane("gemm", 15); }
TEST(SuitesGpu, Decode) { GPULAB_REQUIRE_GPU(); expect_sane("decode", 24); }
TEST(SuitesGpu, UnifiedMemory) { GPULAB_REQUIRE_GPU(); expect_sane("um", 0); }
TEST(SuitesGpu, P2p) { GPULAB_REQUIRE_GPU(); expect_sane("p2p", 0); }
TEST(SuitesGpu, Nccl) { GPULAB_REQUIRE_GPU(); expect_sane("nccl", 12); }
TEST(SuitesGpu, Power) { GPULAB_REQUIRE_GPU(); expect_sane("power", 0); }
