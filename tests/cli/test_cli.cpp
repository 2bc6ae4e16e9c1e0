// Runs the gpulab executable as a user would and checks exit codes and output.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

#include <array>
#include <sstream>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/gpu.h"
#include "common/run_command.h"
#include "common/http_client.h"
#include "core/safetensors.h"

namespace fs = std::filesystem;

using CliRun = gpulab::testing::CommandResult;

// Runs the gpulab executable with `args`; stdout and stderr together.
static CliRun run(const std::string& args) { return gpulab::testing::run_command(std::string(GPULAB_EXE) + " " + args); }

static const std::string kData = GPULAB_TEST_DATA;

static std::string fixture_ids(int case_index, nlohmann::json* greedy = nullptr) {
  std::ifstream in(kData + "/llama_tiny/expected.json");
  const auto c = nlohmann::json::parse(in)["cases"][case_index];
  if (greedy) *greedy = c["greedy_fp32"];
  std::string ids;
  for (const auto& id : c["ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  return ids;
}

// Runs `gpulab logits` on fixture case `case_index` and returns its logits beside transformers'.
struct LogitsPair {
  std::vector<float> got, want;
};
static LogitsPair logits_vs_fixture(int case_index, const std::string& device) {
  std::ifstream in(kData + "/llama_tiny/expected.json");
  const auto c = nlohmann::json::parse(in)["cases"][case_index];
  const fs::path out = fs::temp_directory_path() / ("gpulab_cli_logits_" + device + std::to_string(::getpid()) + ".safetensors");
  const CliRun r = run("logits --device " + device + " --model " + kData + "/llama_tiny --ids " + fixture_ids(case_index) +
                       " --out " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  if (r.exit_code != 0) return {};
  const gpulab::core::SafetensorsFile got(out);
  const gpulab::core::SafetensorsFile want(kData + "/llama_tiny/expected.safetensors");
  const auto* g = got.find("logits");
  const auto* w = want.find(c["logits"].get<std::string>());
  EXPECT_TRUE(g && w);
  EXPECT_EQ(got.tensors().size(), 1u);
  if (!g || !w || g->dtype != gpulab::core::DType::f32 || g->shape != w->shape) {
    ADD_FAILURE() << "logits tensor missing or of the wrong dtype/shape";
    return {};
  }
  LogitsPair pair;
  const auto* gv = reinterpret_cast<const float*>(got.data(*g).data());
  const auto* wv = reinterpret_cast<const float*>(want.data(*w).data());
  pair.got.assign(gv, gv + g->numel());
  pair.want.assign(wv, wv + w->numel());
  fs::remove(out);
  return pair;
}


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

TEST(Cli, PlannedCommandsSayNotBuilt) {
  // Every command --help marks as not built must say so when run, and exit 2.
  std::istringstream help(run("--help").out);
  for (std::string line; std::getline(help, line);) {
    if (line.find("[not built yet]") == std::string::npos) continue;
    std::istringstream words(line);
    std::string name;
    words >> name;
    const CliRun r = run(name + " --some-flag");
    EXPECT_EQ(r.exit_code, 2) << name;
    EXPECT_NE(r.out.find("not built yet"), std::string::npos) << name << ": " << r.out;
  }
  const CliRun serve = run("serve --port 8000");
  EXPECT_EQ(serve.exit_code, 2);
  EXPECT_NE(serve.out.find("--model"), std::string::npos) << serve.out;
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
  const LogitsPair p = logits_vs_fixture(0, "cpu");
  ASSERT_FALSE(p.got.empty());
  float max_ref = 0, max_err = 0;
  for (size_t i = 0; i < p.got.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(p.want[i]));
    max_err = std::max(max_err, std::abs(p.got[i] - p.want[i]));
  }
  EXPECT_LE(max_err, 1e-3f * max_ref);
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
  const CliRun f = run("logits --model " + kData + "/llama_tiny --ids 1 --device cpu --weights fp8");
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_NE(f.out.find("--device cuda"), std::string::npos) << f.out;
  EXPECT_EQ(run("generate --model " + kData + "/llama_tiny --ids 1 --weights fp4").exit_code, 2);
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
  // --file gives what --text gives.
  const fs::path file = fs::temp_directory_path() / ("gpulab_cli_tok_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(file, std::ios::binary) << text;
  const CliRun from_file = run("tokenize --model " + model + " --file " + file.string());
  fs::remove(file);
  EXPECT_EQ(from_file.out, enc.out);
  // The JSON array form pastes back too.
  const CliRun pasted = run("tokenize --model " + model + " --ids '" + nlohmann::json::parse(enc.out)["ids"].dump() + "'");
  EXPECT_EQ(nlohmann::json::parse(pasted.out), nlohmann::json({{"text", text}})) << pasted.out;
}

TEST(Cli, TokenizeBadInputExits2) {
  const std::string model = kData + "/tokenizer_spm";
  const std::vector<std::string> bad = {"--model /no/such/dir --text hi", "--model " + model + " --ids 1,x,3",
                                        "--model " + model + " --ids 99999", "--model " + model,
                                        "--model " + model + " --text a --ids 1",
                                        "--model " + model + " --file /no/such/file.txt"};
  for (const std::string& args : bad) {
    const CliRun r = run("tokenize " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out;
    EXPECT_FALSE(r.out.empty()) << args;
  }
  EXPECT_NE(run("tokenize --model /no/such/dir --text hi").out.find("/no/such/dir"), std::string::npos);
  EXPECT_NE(run("tokenize --model " + model + " --ids 1,x,3").out.find("\"x\""), std::string::npos);
}

// `gpulab serve` as a process: answers, then on SIGTERM finishes the request in flight and exits 0.
TEST(Cli, ServeFinishesInFlightRequestOnSigterm) {
  int port = 0;
  {  // a free port: bind 0, read it, release it
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    ::close(fd);
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string model = kData + "/llama_tiny", p = std::to_string(port);
    ::execl(GPULAB_EXE, GPULAB_EXE, "-q", "serve", "--model", model.c_str(), "--port", p.c_str(), nullptr);
    ::_exit(127);
  }
  bool up = false;
  for (int i = 0; i < 300 && !up; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    try {
      up = gpulab::testing::http_request(port, "GET", "/health").status == 200;
    } catch (const std::exception&) {
    }
  }
  ASSERT_TRUE(up) << "serve did not come up on port " << port;
  const int fd = gpulab::testing::http_connect(port);
  gpulab::testing::http_send(fd, "POST", "/v1/completions", R"({"prompt": "Once", "max_tokens": 300, "temperature": 0, "stream": true})");
  std::string reply(256, '\0');
  const ssize_t first = ::recv(fd, reply.data(), reply.size(), 0);
  ASSERT_GT(first, 0);  // streaming has begun
  reply.resize(static_cast<size_t>(first));
  ::kill(pid, SIGTERM);
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  EXPECT_NE(reply.find("data: [DONE]"), std::string::npos);  // the request ran to its end
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(Cli, LogitsCudaNearTheFixture) {
  GPULAB_REQUIRE_GPU();
  const LogitsPair p = logits_vs_fixture(1, "cuda");
  ASSERT_FALSE(p.got.empty());
  double num = 0, den = 0;
  for (size_t i = 0; i < p.got.size(); ++i) {
    num += double(p.got[i] - p.want[i]) * (p.got[i] - p.want[i]);
    den += double(p.want[i]) * p.want[i];
  }
  EXPECT_LE(std::sqrt(num / den), 2e-2);
}

TEST(Cli, LogitsCudaWithoutDeviceExits3) {
  if (gpulab::core::why_no_device().empty()) GTEST_SKIP() << "a CUDA device is visible";
  EXPECT_EQ(run("logits --device cuda --model " + kData + "/llama_tiny --ids 1,2").exit_code, 3);
}

TEST(Cli, DatasetMakeThenScanCatchesPlantedCorruptFile) {
  const fs::path dir = fs::temp_directory_path() / ("gpulab_cli_ds_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const CliRun made = run("dataset make " + dir.string() + " --classes 3 --images 4 --val 1 --width 40 --height 30");
  ASSERT_EQ(made.exit_code, 0) << made.out;
  const CliRun clean = run("dataset scan --strict --json " + dir.string());
  ASSERT_EQ(clean.exit_code, 0) << clean.out;
  const auto j = nlohmann::json::parse(clean.out);
  EXPECT_EQ(j["splits"][0]["images"].get<int>(), 12);
  EXPECT_EQ(j["splits"][1]["images"].get<int>(), 3);
  EXPECT_EQ(j["decode"]["images"].get<int>(), 15);
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

TEST(Cli, GenerateCpuReproducesTheFixtureGreedy) {
  nlohmann::json greedy;
  const std::string ids = fixture_ids(2, &greedy);
  const CliRun r = run("generate --device cpu --model " + kData + "/llama_tiny --ids " + ids +
                       " --max-tokens 24 --ignore-eos --batch 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["tokens"], greedy);
  EXPECT_EQ(j["results"][1]["tokens"], greedy);
  EXPECT_EQ(j["generated_tokens"], 48);
}

TEST(Cli, GenerateBadInputsExit2) {
  const std::string model = " --device cpu --model " + kData + "/llama_tiny";
  EXPECT_EQ(run("generate" + model).exit_code, 2);                               // no prompt
  EXPECT_EQ(run("generate" + model + " --prompt hi --ids 1").exit_code, 2);      // both
  EXPECT_EQ(run("generate" + model + " --ids 1,9999").exit_code, 2);             // outside the vocabulary
  EXPECT_EQ(run("generate" + model + " --ids 1 --max-tokens 600").exit_code, 2);  // beyond 512 positions
  EXPECT_EQ(run("generate --dummy-weights --config llama2-7b --prompt hi").exit_code, 2);  // text needs a tokenizer
  EXPECT_EQ(run("generate" + model + " --ids 1 --tp 2").exit_code, 2);           // tensor parallel needs cuda
  EXPECT_EQ(run("generate" + model + " --ids 1 --tp 0").exit_code, 2);
}

TEST(Cli, GenerateTpAboveTheVisibleGpusExits2) {
  GPULAB_REQUIRE_GPU();
  const CliRun r = run("generate --model " + kData + "/llama_tiny --ids 1,2 --tp 1024");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("visible"), std::string::npos) << r.out;
}

// The JSON a command printed on stdout, after any log lines it wrote to stderr first (the
// runner merges the two streams; the CUDA engine logs its KV-cache size when it starts).
static nlohmann::json json_after_log_lines(const std::string& out) {
  const size_t start = out.find("\n{");
  return nlohmann::json::parse(out.front() == '{' || start == std::string::npos ? out : out.substr(start + 1));
}

TEST(Cli, GenerateCudaBatchOfCopiesAgrees) {
  GPULAB_REQUIRE_GPU();
  const std::string ids = fixture_ids(0);
  const CliRun r = run("generate --model " + kData + "/llama_tiny --ids " + ids +
                       " --max-tokens 24 --ignore-eos --batch 5 --json --gpu-memory-fraction 0.3");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = json_after_log_lines(r.out);
  ASSERT_EQ(j["results"].size(), 5u);
  EXPECT_EQ(j["device"], "cuda");
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(j["results"][i]["tokens"].size(), 24u);
    EXPECT_EQ(j["results"][i]["tokens"], j["results"][0]["tokens"]);
  }
  // Random weights of a real shape run too (a benchmark configuration, small here).
  const CliRun d = run("generate --dummy-weights --config " + kData + "/llama_tiny/config.json --tokenizer " + kData +
                       "/llama_tiny --ids 1,2,3 --max-tokens 8 --ignore-eos --batch 3 --json --gpu-memory-fraction 0.3");
  ASSERT_EQ(d.exit_code, 0) << d.out;
  EXPECT_EQ(json_after_log_lines(d.out)["generated_tokens"], 24);
  // fp8 weights, random (quantized on the device) and from the checkpoint.
  for (const std::string& model :
       {"--dummy-weights --config " + kData + "/llama_tiny/config.json", "--model " + kData + "/llama_tiny"}) {
    const CliRun f = run("generate " + model + " --weights fp8 --ids 1,2,3 --max-tokens 8 --ignore-eos --batch 3 --json "
                         "--gpu-memory-fraction 0.3");
    ASSERT_EQ(f.exit_code, 0) << f.out;
    const auto jf = json_after_log_lines(f.out);
    EXPECT_EQ(jf["weights"].get<std::string>(), "fp8");
    EXPECT_EQ(jf["generated_tokens"], 24);
  }
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
  if (!gpulab::core::why_no_device().empty()) {
    EXPECT_EQ(run("train --synthetic --steps 1").exit_code, 3);
  }
  EXPECT_EQ(run("train --synthetic --gpus 0").exit_code, 2);
  EXPECT_EQ(run("train --synthetic --allreduce-dtype fp8").exit_code, 2);
  EXPECT_EQ(run("train --synthetic --conv-layout nhcw").exit_code, 2);
  EXPECT_EQ(run("train --synthetic --log-every -1").exit_code, 2);
  const CliRun narrow = run("train --synthetic --depth 18 --width 12");
  EXPECT_EQ(narrow.exit_code, 2) << narrow.out;
  EXPECT_NE(narrow.out.find("ResNet width 12 is not a positive multiple of 8"), std::string::npos) << narrow.out;
  const CliRun env = gpulab::testing::run_command("RANK=1 " + std::string(GPULAB_EXE) + " train --synthetic --steps 1");
  EXPECT_EQ(env.exit_code, 2) << env.out;
  EXPECT_NE(env.out.find("RANK is set but WORLD_SIZE is not"), std::string::npos) << env.out;
}

// A bad checkpoint or weights file is a user mistake, caught before any GPU work.
TEST(Cli, TrainBadCheckpointOrWeightsExit2) {
  const fs::path dir = fs::temp_directory_path() / ("gpulab_cli_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  EXPECT_EQ(run("train --synthetic --resume").exit_code, 2);  // --resume needs --checkpoint
  CliRun r = run("train --synthetic --checkpoint " + dir.string() + " --resume");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("no checkpoint.safetensors"), std::string::npos) << r.out;
  std::ofstream(dir / "checkpoint.safetensors") << "garbage";
  r = run("train --synthetic --checkpoint " + dir.string() + " --resume");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("checkpoint.safetensors"), std::string::npos) << r.out;
  r = run("train --synthetic --checkpoint " + dir.string());  // would overwrite it
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("add --resume"), std::string::npos) << r.out;
  const std::vector<float> w(10 * 2048);
  gpulab::core::write_safetensors(dir / "fc.safetensors", {{"fc.weight", gpulab::core::DType::f32, {10, 2048},
                                                            {reinterpret_cast<const uint8_t*>(w.data()), w.size() * 4}}});
  r = run("train --synthetic --init-from " + (dir / "fc.safetensors").string());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("no tensor 'conv1.weight'"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Cli, GenerateOnRandomWeightsWithoutTokenizerGivesIds) {
  const CliRun r = run("generate --device cpu --dummy-weights --config " + kData +
                       "/llama_tiny/config.json --ids 1,2,3 --max-tokens 5 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["results"][0]["tokens"].size(), 5u);
  EXPECT_EQ(j["results"][0]["text"], "");
  const CliRun text = run("generate --device cpu --dummy-weights --config " + kData + "/llama_tiny/config.json --prompt hi");
  EXPECT_EQ(text.exit_code, 2);
  EXPECT_NE(text.out.find("--tokenizer"), std::string::npos) << text.out;
}
