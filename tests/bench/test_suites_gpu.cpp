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
#include "kernels/skinny_gemm.h"

using namespace gpulab;
using namespace gpulab::bench;

namespace {

std::string run_quick(const std::string& suite, nlohmann::json& results) {
  Options opt;
  opt.quick = true;
  // Under compute-sanitizer the quick pass's 4096³ and 8192³ GEMMs took memcheck past 480 s
  // (session 28): the same kernels there at 512³ and 1024³, each verified as ever.
  // Under racecheck 512³ alone: the same kernels, and it cut the pair at 558 s (session 43).
  if (suite == "gemm" && !sanitizer_tool().empty())
    opt.sizes = under_racecheck() ? std::vector<int64_t>{512} : std::vector<int64_t>{512, 1024};
  // The power suite's 8192³ GEMMs likewise (racecheck cut it at 560 s: session 41): 1024³ there.
  if (suite == "power" && !sanitizer_tool().empty()) opt.sizes = {1024};
  const auto device = core::query_device(0);
  std::ostringstream out;
  Context ctx(opt, device, load_datasheet(device.name), out);
  select_suites({suite}).at(0)->run(ctx);
  results = ctx.log().results();
  return out.str();
}

nlohmann::json expect_sane(const std::string& suite, size_t min_rows) {
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
  return results;
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
  if (!sanitizer_tool().empty()) {
    std::cout << "under " << sanitizer_tool() << ": the levels' order is not judged (instrumented loads)\n" << table;
    return;
  }
  EXPECT_GT(ns["latency_l2"], 2 * ns["latency_l1"]) << table;
  EXPECT_GT(ns["latency_hbm"], 1.3 * ns["latency_l2"]) << table;
}
TEST(SuitesGpu, Transfer) { GPULAB_REQUIRE_GPU(); expect_sane("transfer", 15); }
TEST(SuitesGpu, Launch) { GPULAB_REQUIRE_GPU(); expect_sane("launch", 4); }
// 12 variants a size (9 without fp8 and wgmma), 2 sizes and 1 under racecheck (run_quick).
TEST(SuitesGpu, Gemm) { GPULAB_REQUIRE_GPU(); expect_sane("gemm", under_racecheck() ? 9 : 15); }
// 80 GEMM rows (4 layers: the tensor-core kernel and cuBLASLt at 5 row counts, the GEMV on bf16
// and on e4m3 weights at 1 and 2, W8A8 on the tensor-core kernel and on cuBLASLt at 4, 8 and 16),
// 92 where the GPU runs wgmma (W8A8 on it at those rows too), then decode attention: 2 shapes x
// 2 paths (CUDA cores, tensor cores) x 2 batches x 2 contexts, in us and in GB/s.
TEST(SuitesGpu, Decode) {
  GPULAB_REQUIRE_GPU();
  const nlohmann::json results = expect_sane("decode", 112);
  int attention_rows = 0, fp8_rows = 0, w8a8_rows = 0, wgmma_rows = 0;
  for (const auto& r : results) {
    const std::string name = r["name"].get<std::string>();
    const bool wgmma = name.rfind("skinny_w8a8_wgmma_", 0) == 0;
    attention_rows += name.rfind("attention_", 0) == 0;
    fp8_rows += name.rfind("gemv_fp8_", 0) == 0;
    wgmma_rows += wgmma;
    w8a8_rows += !wgmma && (name.rfind("skinny_w8a8_", 0) == 0 || name.rfind("cublaslt_fp8_", 0) == 0);
  }
  EXPECT_EQ(attention_rows, 32);
  EXPECT_EQ(fp8_rows, 8);
  EXPECT_EQ(w8a8_rows, 24);
  EXPECT_EQ(wgmma_rows, kernels::skinny_wgmma_runs_here() ? 12 : 0);
}
TEST(SuitesGpu, UnifiedMemory) { GPULAB_REQUIRE_GPU(); expect_sane("um", 0); }
TEST(SuitesGpu, P2p) { GPULAB_REQUIRE_GPU(); expect_sane("p2p", 0); }
// Every plain all-reduce row has its symmetric-memory twin of the same size (their #wrong, as every
// row's, fails the suite), over a symmetric window where several GPUs reach each other.
TEST(SuitesGpu, Nccl) {
  GPULAB_REQUIRE_GPU();
  const nlohmann::json results = expect_sane("nccl", 16);
  std::map<std::string, const nlohmann::json*> rows;
  for (const auto& r : results) rows[r["name"].get<std::string>()] = &r;
  const int gpus = visible_gpus();
  size_t twins = 0;
  for (const auto& [name, row] : rows) {
    if (name.rfind("all_reduce_", 0) != 0 || name.rfind("all_reduce_symmetric_", 0) == 0) continue;
    const auto twin = rows.find("all_reduce_symmetric_" + name.substr(std::string("all_reduce_").size()));
    ASSERT_NE(twin, rows.end()) << name << " has no symmetric row";
    const nlohmann::json& p = (*twin->second)["params"];
    EXPECT_EQ(p["bytes"].get<size_t>(), (*row)["params"]["bytes"].get<size_t>());
    EXPECT_EQ(p["wrong"].get<uint64_t>(), 0u) << twin->first;
    if (gpus > 1 && gpus_reach_each_other(gpus)) {
      EXPECT_TRUE(p["symmetric"].get<bool>()) << twin->first;
    }
    ++twins;
  }
  EXPECT_GT(twins, 0u);
}
TEST(SuitesGpu, Power) { GPULAB_REQUIRE_GPU(); expect_sane("power", 0); }
