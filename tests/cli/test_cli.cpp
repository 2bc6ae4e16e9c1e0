// Runs the gpulab executable as a user would and checks exit codes and output.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/gpu.h"
#include "core/safetensors.h"

namespace fs = std::filesystem;

struct CliRun {
  int exit_code;
  std::string out;  // stdout and stderr together
};

static CliRun run(const std::string& args) {
  const std::string cmd = std::string(GPULAB_EXE) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

static const std::string kData = GPULAB_TEST_DATA;

TEST(Cli, HelpListsEveryPlannedCommand) {
  const CliRun r = run("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"info", "inspect", "bench", "train", "dataset", "generate", "serve", "tokenize", "logits", "diagnose"})
    EXPECT_NE(r.out.find(cmd), std::string::npos) << cmd;
}

TEST(Cli, UnknownFlagIsAUsageError) {
  EXPECT_EQ(run("inspect --no-such-flag x").exit_code, 2);
  EXPECT_EQ(run("").exit_code, 2);
}

TEST(Cli, InspectShardedAndSingleGiveSameTotals) {
  const CliRun single = run("inspect --json " + kData + "/llama_tiny");
  const CliRun sharded = run("inspect --json " + kData + "/llama_tiny_sharded");
  ASSERT_EQ(single.exit_code, 0) << single.out;
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out;
  const auto a = nlohmann::json::parse(single.out), b = nlohmann::json::parse(sharded.out);
  EXPECT_EQ(a["total"]["tensors"], b["total"]["tensors"]);
  EXPECT_EQ(a["total"]["params"], b["total"]["params"]);
  EXPECT_EQ(a["total"]["bytes"], b["total"]["bytes"]);
  EXPECT_EQ(b["total"]["shards"], 4);
  EXPECT_EQ(a["tensors"].size(), 21u);  // embed, norm, lm_head + 9 per layer x 2
  const CliRun text = run("inspect " + kData + "/llama_tiny_sharded");
  EXPECT_NE(text.out.find("model-00004-of-00004.safetensors"), std::string::npos);
}

TEST(Cli, InspectMalformedFileSaysWhatAndExits2) {
  const fs::path bad = fs::temp_directory_path() / ("gpulab_cli_bad_" + std::to_string(::getpid()) + ".safetensors");
  std::ofstream(bad, std::ios::binary) << std::string("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":", 13);
  const CliRun r = run("inspect " + bad.string());
  fs::remove(bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find(bad.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("runs past the end"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;  // one line
}

TEST(Cli, InspectMissingPath) {
  const CliRun r = run("inspect /no/such/checkpoint");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("no such file"), std::string::npos) << r.out;
}

TEST(Cli, PlannedCommandSaysNotBuilt) {
  const CliRun r = run("serve --port 8000");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("not built yet"), std::string::npos) << r.out;
}

TEST(Cli, InfoWithoutDeviceExits3WithHostFacts) {
  if (gpulab::core::why_no_device().empty()) GTEST_SKIP() << "a CUDA device is visible; the GPU variant covers it";
  const CliRun r = run("info");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.out.find("Host"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("H200 SXM"), std::string::npos) << r.out;  // the accelerator table
  EXPECT_NE(r.out.find("no "), std::string::npos) << r.out;
}

TEST(Cli, InfoJsonOnDevice) {
  GPULAB_REQUIRE_GPU();
  const CliRun r = run("info --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j["devices"].empty());
  EXPECT_GT(j["devices"][0]["sm_count"].get<int>(), 0);
  EXPECT_FALSE(j["software"]["cudnn"].get<std::string>().empty());
}

TEST(Cli, LogitsCpuWritesTheFixtureLogits) {
  std::ifstream in(kData + "/llama_tiny/expected.json");
  const auto c = nlohmann::json::parse(in)["cases"][0];
  std::string ids;
  for (const auto& id : c["ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  const fs::path out = fs::temp_directory_path() / ("gpulab_cli_logits_" + std::to_string(::getpid()) + ".safetensors");
  const CliRun r = run("logits --model " + kData + "/llama_tiny --ids " + ids + " --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const gpulab::core::SafetensorsFile got(out);
  const gpulab::core::SafetensorsFile want(kData + "/llama_tiny/expected.safetensors");
  const auto* g = got.find("logits");
  const auto* w = want.find(c["logits"].get<std::string>());
  ASSERT_TRUE(g && w);
  ASSERT_EQ(g->dtype, gpulab::core::DType::f32);
  ASSERT_EQ(g->shape, w->shape);
  ASSERT_EQ(got.tensors().size(), 1u);
  const auto* gv = reinterpret_cast<const float*>(got.data(*g).data());
  const auto* wv = reinterpret_cast<const float*>(want.data(*w).data());
  float max_ref = 0, max_err = 0;
  for (uint64_t i = 0; i < g->numel(); ++i) {
    max_ref = std::max(max_ref, std::abs(wv[i]));
    max_err = std::max(max_err, std::abs(gv[i] - wv[i]));
  }
  EXPECT_LE(max_err, 1e-3f * max_ref);
  fs::remove(out);
}

TEST(Cli, LogitsBadInputsExit2) {
  EXPECT_EQ(run("logits --model " + kData + "/llama_tiny --ids 1,x,3").exit_code, 2);
  EXPECT_EQ(run("logits --model " + kData + "/llama_tiny --ids 1,5000").exit_code, 2);
  const CliRun r = run("logits --model /no/such/model --ids 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("/no/such/model"), std::string::npos) << r.out;
  const CliRun d = run("logits --dummy-weights --config llama9 --ids 1");
  EXPECT_EQ(d.exit_code, 2);
  EXPECT_NE(d.out.find("llama2-7b"), std::string::npos) << d.out;
}

TEST(Cli, TokenizeEncodesAndDecodesLikeHuggingFace) {
  const std::string model = kData + "/tokenizer_spm";
  const auto cases = nlohmann::json::parse(std::ifstream(model + "/tokenizer_cases.json"))["cases"];
  const std::string text = cases[5]["text"];  // "GPUs turned from graphics into general compute."
  const CliRun enc = run("tokenize --model " + model + " --text '" + text + "'");
  ASSERT_EQ(enc.exit_code, 0) << enc.out;
  EXPECT_EQ(nlohmann::json::parse(enc.out), nlohmann::json({{"ids", cases[5]["ids"]}}));
  std::string ids;
  for (const auto& id : cases[5]["ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  const CliRun dec = run("tokenize --model " + model + " --ids " + ids);
  ASSERT_EQ(dec.exit_code, 0) << dec.out;
  EXPECT_EQ(nlohmann::json::parse(dec.out), nlohmann::json({{"text", text}}));
  // The JSON array form pastes back too.
  const CliRun pasted = run("tokenize --model " + model + " --ids '" + nlohmann::json::parse(enc.out)["ids"].dump() + "'");
  EXPECT_EQ(nlohmann::json::parse(pasted.out), nlohmann::json({{"text", text}})) << pasted.out;
}

TEST(Cli, TokenizeBadInputExits2) {
  const std::string model = kData + "/tokenizer_spm";
  const std::vector<std::string> bad = {"--model /no/such/dir --text hi", "--model " + model + " --ids 1,x,3",
                                        "--model " + model + " --ids 99999", "--model " + model,
                                        "--model " + model + " --text a --ids 1"};
  for (const std::string& args : bad) {
    const CliRun r = run("tokenize " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out;
    EXPECT_FALSE(r.out.empty()) << args;
  }
  EXPECT_NE(run("tokenize --model /no/such/dir --text hi").out.find("/no/such/dir"), std::string::npos);
  EXPECT_NE(run("tokenize --model " + model + " --ids 1,x,3").out.find("\"x\""), std::string::npos);
}
