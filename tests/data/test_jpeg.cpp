// JPEG codec: round trip, and every kind of damage gives CorruptImageError, never a crash.
#include <gtest/gtest.h>

#include <cstdlib>

#include "data/jpeg.h"
#include "data/rng.h"

using namespace gpulab::data;

static Image smooth_image(int w, int h) {
  Image img{w, h, std::vector<uint8_t>(size_t(w) * h * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      img.rgb[(size_t(y) * w + x) * 3 + 0] = uint8_t(x * 255 / (w - 1));
      img.rgb[(size_t(y) * w + x) * 3 + 1] = uint8_t(y * 255 / (h - 1));
      img.rgb[(size_t(y) * w + x) * 3 + 2] = 128;
    }
  return img;
}

TEST(Jpeg, RoundTripKeepsSizeAndPixelsClose) {
  const Image img = smooth_image(67, 41);  // odd sizes exercise 4:2:0 edge blocks
  const auto bytes = encode_jpeg(img, 95);
  ASSERT_GT(bytes.size(), 100u);
  EXPECT_EQ(bytes[0], 0xFF);
  EXPECT_EQ(bytes[1], 0xD8);
  const Image back = decode_jpeg(bytes, "mem");
  ASSERT_EQ(back.width, 67);
  ASSERT_EQ(back.height, 41);
  double err = 0;
  int worst = 0;
  for (size_t i = 0; i < img.rgb.size(); ++i) {
    const int d = std::abs(int(img.rgb[i]) - int(back.rgb[i]));
    err += d;
    worst = std::max(worst, d);
  }
  EXPECT_LT(err / img.rgb.size(), 2.0);  // a smooth ramp at q95 stays within a few levels
  EXPECT_LT(worst, 24);
}

TEST(Jpeg, DamagedInputsThrowTypedError) {
  const auto good = encode_jpeg(smooth_image(64, 48), 90);
  EXPECT_THROW(decode_jpeg({}, "empty"), CorruptImageError);
  const std::vector<uint8_t> text{'h', 'e', 'l', 'l', 'o'};
  EXPECT_THROW(decode_jpeg(text, "text"), CorruptImageError);
  // Truncated at several points: header only, mid-scan, just before EOI.
  for (size_t keep : {size_t(20), good.size() / 3, good.size() / 2, good.size() - 10}) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + keep);
    EXPECT_THROW(decode_jpeg(cut, "cut"), CorruptImageError) << "kept " << keep << " of " << good.size();
  }
  // Random garbage after a valid SOI marker.
  Rng rng(7);
  std::vector<uint8_t> junk{0xFF, 0xD8};
  for (int i = 0; i < 4000; ++i) junk.push_back(uint8_t(rng.next()));
  EXPECT_THROW(decode_jpeg(junk, "junk"), CorruptImageError);
  try {
    decode_jpeg(text, "some/file.JPEG");
    FAIL();
  } catch (const CorruptImageError& e) {
    EXPECT_NE(std::string(e.what()).find("some/file.JPEG"), std::string::npos);
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(Jpeg, MissingFileIsInputError) {
  EXPECT_THROW(read_jpeg("/nonexistent/gpulab/x.JPEG"), gpulab::core::InputError);
}
