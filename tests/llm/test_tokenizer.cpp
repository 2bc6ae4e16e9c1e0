// The tokenizer against Hugging Face `tokenizers` 0.23.2 fixtures, malformed files, and random bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "llm/tokenizer.h"

using gpulab::llm::Tokenizer;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kData = GPULAB_TEST_DATA;

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, EncodeAndDecodeEveryCaseExactly) {
  const fs::path dir = kData / GetParam();
  const Tokenizer tok = Tokenizer::from_file(dir);
  const json cases = read_json(dir / "tokenizer_cases.json")["cases"];
  ASSERT_GT(cases.size(), 10u);
  for (const json& c : cases) {
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), expected) << "text: " << text;
    EXPECT_EQ(tok.decode(expected), c["decoded"].get<std::string>()) << "text: " << text;
  }
}

INSTANTIATE_TEST_SUITE_P(HuggingFace, FixtureTest, ::testing::Values("tokenizer_bytelevel", "tokenizer_spm"));

}  // namespace
