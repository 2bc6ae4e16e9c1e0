// Regression tests for inputs the fuzzers (tests/fuzz) found or aim at: hostile dataset trees and
// JPEG headers that would make the decoder allocate gigabytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/folder.h"
#include "data/jpeg.h"

using namespace gpulab::data;
namespace fs = std::filesystem;

// fuzz_image_folder: a symbolic link loop beside the classes escaped as std::filesystem_error.
TEST(Robustness, SymlinkLoopInDatasetIsAnInputError) {
  const fs::path root = fs::temp_directory_path() / ("gpulab_loop_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "cat");
  std::ofstream(root / "cat" / "a.jpg") << "x";
  fs::create_symlink("loop", root / "loop");
  try {
    scan_image_folder(root);
    ADD_FAILURE() << "a link loop must be refused";
  } catch (const gpulab::core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find((root / "loop").string()), std::string::npos) << e.what();
  }
  // The same loop inside a class folder.
  fs::remove(root / "loop");
  fs::create_symlink("self", root / "cat" / "self");
  EXPECT_THROW(scan_image_folder(root), gpulab::core::InputError);
  // A dangling link is not a folder or a file: skipped, the rest listed.
  fs::remove(root / "cat" / "self");
  fs::create_symlink("/no/such/place", root / "gone");
  EXPECT_EQ(scan_image_folder(root).samples.size(), 1u);
  fs::remove_all(root);
}

// A valid small JPEG whose frame header claims 65000 x 65000 must not allocate 12 GB.
TEST(Robustness, JpegHeaderClaimingHugeSizeIsCorrupt) {
  Image img{16, 8, std::vector<uint8_t>(16 * 8 * 3, 128)};
  std::vector<uint8_t> bytes = encode_jpeg(img, 90);
  size_t sof = 0;  // walk the marker segments after SOI to the baseline frame header
  for (size_t i = 2; i + 4 < bytes.size() && bytes[i] == 0xFF && !sof; i += 2 + (bytes[i + 2] << 8 | bytes[i + 3]))
    if (bytes[i + 1] == 0xC0) sof = i;
  ASSERT_NE(sof, 0u) << "no baseline frame header";
  for (size_t at : {sof + 5, sof + 7}) {  // height, width: big-endian 16 bits
    bytes[at] = 65000 >> 8;
    bytes[at + 1] = 65000 & 0xFF;
  }
  try {
    decode_jpeg(bytes, "huge.jpg");
    ADD_FAILURE() << "a 65000 x 65000 header must be refused";
  } catch (const CorruptImageError& e) {
    EXPECT_NE(std::string(e.what()).find("65000x65000"), std::string::npos) << e.what();
  }
}

// A failed decode must not poison the thread's decoder: the next valid file decodes exactly.
// (Found through the JPEG test above, which failed only after Jpeg.DamagedInputsThrowTypedError.)
TEST(Robustness, JpegDecoderRecoversAfterCorruptInputs) {
  Image img{40, 24, std::vector<uint8_t>(40 * 24 * 3)};
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = uint8_t(i * 7 % 251);
  const std::vector<uint8_t> good = encode_jpeg(img, 90);
  const Image reference = decode_jpeg(good, "good.jpg");
  for (size_t keep : {size_t(20), good.size() / 3, good.size() / 2, good.size() - 10}) {
    EXPECT_THROW(decode_jpeg(std::span(good).first(keep), "cut.jpg"), CorruptImageError);
    const Image again = decode_jpeg(good, "good.jpg");
    EXPECT_EQ(again.rgb, reference.rgb) << "after a file cut to " << keep << " bytes";
  }
  std::vector<uint8_t> junk{0xFF, 0xD8};
  for (int i = 0; i < 4000; ++i) junk.push_back(uint8_t(i * 131 + 7));
  EXPECT_THROW(decode_jpeg(junk, "junk.jpg"), CorruptImageError);
  EXPECT_EQ(decode_jpeg(good, "good.jpg").rgb, reference.rgb) << "after junk";
}
