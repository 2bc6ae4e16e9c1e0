// The GPU loader's file arena (where its files are read for the decoder) and the file reads it
// uses: offsets, alignment, bytes kept across growth, and rare, geometric growth. Pageable mode
// only: page-locked memory needs a device (the gpu tests run the loader with both).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "common/temp_dir.h"
#include "core/error.h"
#include "data/file_arena.h"
#include "data/jpeg.h"
#include "data/rng.h"

using namespace gpulab;
using namespace gpulab::data;

TEST(LoaderFileArena, RegionsAreAlignedAppendedAndKeptAcrossGrowth) {
  FileArena arena(false);
  EXPECT_FALSE(arena.pinned());
  Rng rng(17);
  int frees = 0;
  auto count_free = [&] { ++frees; };
  // A batch's files as the loader places them: a first round, then rounds of replacements.
  for (int batch = 0; batch < 40; ++batch) {
    arena.clear();
    std::vector<std::pair<size_t, std::vector<uint8_t>>> placed;  // offset, bytes written there
    size_t end = 0;
    for (int round = 0; round < 4; ++round) {
      std::vector<size_t> sizes(round == 0 ? 32 : 1 + rng.next() % 3);
      for (auto& s : sizes) s = rng.next() % 5000 + (batch == 20 ? 20000 : 0);  // empty files too; one larger batch
      const int frees_before = frees;
      const size_t capacity_before = arena.capacity();
      const std::vector<size_t> at = arena.place(sizes, count_free);
      ASSERT_EQ(at.size(), sizes.size());
      for (size_t k = 0; k < sizes.size(); ++k) {
        EXPECT_EQ(at[k] % FileArena::kAlign, 0u);
        EXPECT_GE(at[k], end) << "a region overlaps one placed before it in the batch";
        end = at[k] + sizes[k];
        std::vector<uint8_t> bytes(sizes[k]);
        for (auto& v : bytes) v = uint8_t(rng.next());
        std::memcpy(arena.data() + at[k], bytes.data(), bytes.size());
        placed.emplace_back(at[k], std::move(bytes));
      }
      EXPECT_LE(end, arena.capacity());
      if (arena.capacity() != capacity_before) {
        EXPECT_EQ(frees, frees_before + 1) << "the old buffer goes only after its readers were waited for";
        EXPECT_GE(arena.capacity(), capacity_before + capacity_before / 4) << "growth is geometric";
      } else {
        EXPECT_EQ(frees, frees_before);
      }
      for (const auto& [offset, bytes] : placed)  // every region of the batch, also across a growth
        ASSERT_EQ(std::memcmp(arena.data() + offset, bytes.data(), bytes.size()), 0) << "batch " << batch;
    }
  }
  // About 32 x 2.5 kB a batch, 40 batches: the first batch, a few growths within early
  // batches, and the one larger batch.
  EXPECT_GE(frees, 2);
  EXPECT_LE(frees, 8);
}

TEST(LoaderFileArena, ClearStartsOverAndNothingGrowsForAnEqualBatch) {
  FileArena arena(false);
  const std::vector<size_t> sizes = {1, 64, 65, 0, 200};
  int frees = 0;
  const std::vector<size_t> first = arena.place(sizes, [&] { ++frees; });
  EXPECT_EQ(first, (std::vector<size_t>{0, 64, 128, 256, 256}));
  EXPECT_EQ(frees, 1);
  arena.clear();
  EXPECT_EQ(arena.place(sizes, [&] { ++frees; }), first);
  EXPECT_EQ(frees, 1);
}

TEST(JpegFileRead, SizeThenReadAndClearErrors) {
  gpulab::testing::TempDir t("file_read");
  std::filesystem::create_directories(t.path);
  const std::filesystem::path f = t.path / "a.bin";
  std::ofstream(f, std::ios::binary) << "0123456789";
  EXPECT_EQ(file_size_of(f), 10u);
  std::vector<uint8_t> got(10, 0xEE);
  read_file_into(f, got);
  EXPECT_EQ(std::string(got.begin(), got.end()), "0123456789");
  EXPECT_EQ(read_file_bytes(f), got);
  std::vector<uint8_t> longer(11);
  EXPECT_THROW(read_file_into(f, longer), core::InputError);  // the file shrank after its size was taken
  EXPECT_THROW(file_size_of(t.path / "missing.jpg"), core::InputError);
  EXPECT_THROW(read_file_into(t.path / "missing.jpg", got), core::InputError);
}
