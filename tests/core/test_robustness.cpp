// Regression tests for checkpoint inputs the fuzzers (tests/fuzz) found.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/safetensors.h"

using namespace gpulab::core;
namespace fs = std::filesystem;

// crash_shard_name_too_long in the fuzz corpus: a shard name longer than the file system takes
// escaped Checkpoint as std::filesystem_error (ENAMETOOLONG) instead of naming the index.
TEST(CheckpointRobustness, ShardNameTheFileSystemRefusesIsAnInputError) {
  const fs::path dir = fs::temp_directory_path() / ("gpulab_longshard_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string name = std::string(300, 'G') + ".safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"a": ")" + name + R"("}})";
  try {
    Checkpoint ckpt(dir);
    ADD_FAILURE() << "a 300-byte shard name must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be read"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.safetensors.index.json"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}
