// Runs the gpulab executable as a user would and checks exit codes and output.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/gpu.h"

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

TEST(Cli, DatasetMakeThenScanCatchesPlantedCorruptFile) {
  const fs::path dir = fs::temp_directory_path() / ("gpulab_cli_ds_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const CliRun made = run("dataset make " + dir.string() + " --classes 3 --images 4 --val 1 --width 40 --height 30");
  ASSERT_EQ(made.exit_code, 0) << made.out;
  const CliRun clean = run("dataset scan --strict --json " + dir.string());
  ASSERT_EQ(clean.exit_code, 0) << clean.out;
  const auto j = nlohmann::json::parse(clean.out);
  EXPECT_EQ(j["splits"][0]["images"], 12);
  EXPECT_EQ(j["splits"][1]["images"], 3);
  EXPECT_EQ(j["decode"]["images"], 15);
  EXPECT_TRUE(j["corrupt"].empty());
  const fs::path victim = dir / "val" / "c0001_red_square" / "img_000000.JPEG";
  fs::resize_file(victim, 200);
  const CliRun lax = run("dataset scan " + dir.string());
  EXPECT_EQ(lax.exit_code, 0) << lax.out;
  EXPECT_NE(lax.out.find(victim.string()), std::string::npos) << lax.out;
  EXPECT_EQ(run("dataset scan --strict " + dir.string()).exit_code, 2);
  EXPECT_EQ(run("dataset make " + dir.string()).exit_code, 2);  // refuses a non-empty folder
  fs::remove_all(dir);
}

TEST(Cli, TrainUserMistakesExit2AndNoDeviceExits3) {
  EXPECT_EQ(run("train --steps 1").exit_code, 2);  // neither --data nor --synthetic
  EXPECT_EQ(run("train --data /nonexistent/gpulab --steps 1").exit_code, 2);
  EXPECT_EQ(run("train --synthetic --precision fp8").exit_code, 2);
  EXPECT_EQ(run("train --synthetic --data /tmp").exit_code, 2);
  EXPECT_EQ(run("train --synthetic --eval --steps 1").exit_code, 2);
  const fs::path empty = fs::temp_directory_path() / ("gpulab_cli_empty_" + std::to_string(::getpid()));
  fs::create_directories(empty / "classA");
  const CliRun r = run("train --data " + empty.string() + " --steps 1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("no .JPEG"), std::string::npos) << r.out;
  fs::remove_all(empty);
  if (!gpulab::core::why_no_device().empty()) EXPECT_EQ(run("train --synthetic --steps 1").exit_code, 3);
}
