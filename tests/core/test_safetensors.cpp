#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/safetensors.h"

using namespace gpulab::core;
namespace fs = std::filesystem;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gpulab_st_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A raw file: 8-byte length, the header text as given, then `data_bytes` bytes.
  fs::path raw(const std::string& name, const std::string& header, size_t data_bytes,
               std::optional<uint64_t> declared_len = std::nullopt) {
    std::string bytes(8, '\0');
    const uint64_t n = declared_len.value_or(header.size());
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
    bytes += header;
    bytes.append(data_bytes, '\x11');
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return dir_ / name;
  }

  // Expects that opening `path` throws an InputError whose message contains `needle`.
  static void expect_bad(const fs::path& path, const std::string& needle) {
    try {
      Checkpoint ckpt(path);
      FAIL() << "no error for " << path;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(e.exit_code(), kExitBadInput);
    }
  }
  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripKeepsEveryByte) {
  std::mt19937 rng(1234);
  std::vector<uint8_t> a(4 * 3 * 5), b(2 * 7), c(8);
  for (auto* v : {&a, &b, &c})
    for (auto& x : *v) x = static_cast<uint8_t>(rng());
  write_safetensors(dir_ / "m.safetensors",
                    {{"w.f32", DType::f32, {3, 5}, a}, {"b.bf16", DType::bf16, {7}, b}, {"s.i64", DType::i64, {}, c}},
                    {{"format", "pt"}});
  SafetensorsFile f(dir_ / "m.safetensors");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.header_bytes() % 8, 0u);
  const auto* w = f.find("w.f32");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::f32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{3, 5}));
  auto wd = f.data(*w);
  EXPECT_TRUE(std::equal(wd.begin(), wd.end(), a.begin(), a.end()));
  auto bd = f.data(*f.find("b.bf16"));
  EXPECT_TRUE(std::equal(bd.begin(), bd.end(), b.begin(), b.end()));
  const auto* s = f.find("s.i64");
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1u);
  EXPECT_EQ(std::memcmp(f.data(*s).data(), c.data(), 8), 0);
}

TEST_F(SafetensorsTest, WriterRefusesWrongSizeAndLeavesNoFile) {
  std::vector<uint8_t> a(10);
  EXPECT_THROW(write_safetensors(dir_ / "x.safetensors", {{"a", DType::f32, {3}, a}}), Error);
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors"));
}

TEST_F(SafetensorsTest, AtomicWriteReplacesWholeFile) {
  write_file_atomic(dir_ / "f.txt", std::string("first version, long"));
  write_file_atomic(dir_ / "f.txt", std::string("second"));
  std::ifstream in(dir_ / "f.txt");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "second");
  size_t files = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1u);  // no temporary left behind
}

TEST_F(SafetensorsTest, TruncatedBeforeHeaderLength) {
  std::ofstream(dir_ / "t.safetensors", std::ios::binary) << "abc";
  expect_bad(dir_ / "t.safetensors", "truncated");
}

TEST_F(SafetensorsTest, HeaderLengthPastEnd) {
  expect_bad(raw("h.safetensors", "{}", 0, 1000), "runs past the end of the file");
}

TEST_F(SafetensorsTest, InvalidJsonHeader) {
  expect_bad(raw("j.safetensors", "{\"a\": [1, 2", 0), "not valid JSON");
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  expect_bad(raw("o.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
             "run past the end of the data");
}

TEST_F(SafetensorsTest, OffsetsOverlapping) {
  expect_bad(raw("v.safetensors",
                 R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12),
             "overlapping");
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_bad(raw("d.safetensors", R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1),
             "unknown dtype 'F4'");
}

TEST_F(SafetensorsTest, ShapeTimesDtypeDisagreesWithRange) {
  expect_bad(raw("s.safetensors", R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8),
             "shape x dtype is 6 bytes");
}

TEST_F(SafetensorsTest, NegativeOrNonIntegerShape) {
  expect_bad(raw("n.safetensors", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
             "not a non-negative integer");
}

TEST_F(SafetensorsTest, MissingShardNamedByIndex) {
  std::vector<uint8_t> a(4);
  write_safetensors(dir_ / "model-1.safetensors", {{"a", DType::f32, {1}, a}});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"a":"model-1.safetensors","b":"model-2.safetensors"}})";
  expect_bad(dir_, "shard 'model-2.safetensors' named by the index is missing");
}

TEST_F(SafetensorsTest, TensorMissingFromItsShard) {
  std::vector<uint8_t> a(4);
  write_safetensors(dir_ / "model-1.safetensors", {{"a", DType::f32, {1}, a}});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map":{"a":"model-1.safetensors","zz":"model-1.safetensors"}})";
  expect_bad(dir_, "tensor 'zz' named by the index is not in this shard");
}

TEST_F(SafetensorsTest, EveryTruncationOfARealFileIsRejectedCleanly) {
  const fs::path src = fs::path(GPULAB_TEST_DATA) / "llama_tiny" / "model.safetensors";
  std::ifstream in(src, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GT(bytes.size(), 1000u);
  for (size_t cut : {size_t{0}, size_t{7}, size_t{8}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    std::ofstream(dir_ / "cut.safetensors", std::ios::binary | std::ios::trunc) << bytes.substr(0, cut);
    EXPECT_THROW(SafetensorsFile(dir_ / "cut.safetensors"), InputError) << "cut at " << cut;
  }
}

TEST(Checkpoint, ShardedFixtureMatchesSingleFile) {
  const Checkpoint single(fs::path(GPULAB_TEST_DATA) / "llama_tiny");
  const Checkpoint sharded(fs::path(GPULAB_TEST_DATA) / "llama_tiny_sharded");
  EXPECT_EQ(sharded.shards().size(), 4u);
  EXPECT_EQ(single.shards().size(), 1u);
  ASSERT_EQ(single.tensors().size(), sharded.tensors().size());
  EXPECT_EQ(single.total_bytes(), sharded.total_bytes());
  EXPECT_EQ(single.total_params(), sharded.total_params());
  for (size_t i = 0; i < single.tensors().size(); ++i) {
    const auto& a = single.tensors()[i];
    const auto& b = sharded.tensors()[i];
    EXPECT_EQ(a.info->name, b.info->name);
    EXPECT_EQ(a.info->shape, b.info->shape);
    auto da = single.data(a), db = sharded.data(b);
    EXPECT_TRUE(std::equal(da.begin(), da.end(), db.begin(), db.end())) << a.info->name;
  }
  const auto& embed = single.at("model.embed_tokens.weight");
  EXPECT_EQ(embed.info->shape, (std::vector<int64_t>{1024, 128}));
  EXPECT_EQ(embed.info->dtype, DType::bf16);
  EXPECT_THROW(single.at("no.such.tensor"), InputError);
}

}  // namespace
