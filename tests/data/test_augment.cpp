// CPU augmentation against torchvision's algorithm, with hand-computed expectations.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>

#include "core/dtype.h"
#include "data/augment.h"

using namespace gpulab::data;

namespace {

// Replays given uniform draws (in order) and randint results, recording the calls.
struct ScriptedRng {
  std::deque<double> uniforms;
  std::deque<int64_t> ints;
  std::vector<std::pair<int64_t, int64_t>> randint_calls;
  double uniform(double lo, double hi) {
    const double u = uniforms.front();  // a fraction of the range
    uniforms.pop_front();
    return lo + (hi - lo) * u;
  }
  int64_t randint(int64_t lo, int64_t hi) {
    randint_calls.emplace_back(lo, hi);
    const int64_t v = ints.front();
    ints.pop_front();
    return v;
  }
};

Image random_image(int w, int h, uint64_t seed) {
  Rng rng(seed);
  Image img{w, h, std::vector<uint8_t>(size_t(w) * h * 3)};
  for (auto& v : img.rgb) v = uint8_t(rng.next());
  return img;
}

}  // namespace

TEST(RandomResizedCrop, FirstFittingAttemptWins) {
  // 500x375: area 187500. Draw scale fraction u=0.5 -> 0.08 + 0.92*0.5 = 0.54 -> 101250;
  // log-ratio fraction 0.5 -> ratio 1 -> w = h = round(sqrt(101250)) = round(318.198) = 318.
  ScriptedRng rng{{0.5, 0.5}, {10, 20}};
  const CropBox box = random_resized_crop_box(500, 375, rng);
  EXPECT_EQ(box, (CropBox{10, 20, 318, 318}));
  ASSERT_EQ(rng.randint_calls.size(), 2u);
  EXPECT_EQ(rng.randint_calls[0], (std::pair<int64_t, int64_t>{0, 375 - 318 + 1}));  // top first
  EXPECT_EQ(rng.randint_calls[1], (std::pair<int64_t, int64_t>{0, 500 - 318 + 1}));
}

TEST(RandomResizedCrop, RatioIsLogUniformAndRejectsBoxesThatDoNotFit) {
  // Attempt 1: scale 1.0 with ratio 4/3 on a 100x100 image -> w = round(sqrt(10000*4/3)) = 115 > 100:
  // rejected. Attempt 2: scale 0.08+0.92*0.25=0.31, ratio fraction 0 -> 3/4:
  // w = round(sqrt(3100*0.75)) = round(48.218) = 48, h = round(sqrt(3100/0.75)) = round(64.291) = 64.
  ScriptedRng rng{{1.0, 1.0, 0.25, 0.0}, {3, 4}};
  const CropBox box = random_resized_crop_box(100, 100, rng);
  EXPECT_EQ(box, (CropBox{3, 4, 64, 48}));
  EXPECT_TRUE(rng.uniforms.empty());
}

TEST(RandomResizedCrop, TenFailuresFallBackToClampedCenterCrop) {
  // A 1000x100 strip; every attempt asks for the whole area at ratio 3/4 -> h = 365 > 100.
  std::deque<double> u;
  for (int i = 0; i < 10; ++i) u.insert(u.end(), {1.0, 0.0});
  ScriptedRng rng{u, {}};
  const CropBox box = random_resized_crop_box(1000, 100, rng);
  // in_ratio 10 > 4/3: h = 100, w = round(100 * 4/3) = 133, centred: left (1000-133)/2 = 433.
  EXPECT_EQ(box, (CropBox{0, 433, 100, 133}));
  EXPECT_TRUE(rng.uniforms.empty());
  EXPECT_TRUE(rng.randint_calls.empty());
  // Tall strip: in_ratio 0.1 < 3/4: w = 100, h = round(100 / 0.75) = 133, top (1000-133)/2 = 433.
  for (int i = 0; i < 10; ++i) rng.uniforms.insert(rng.uniforms.end(), {1.0, 1.0});
  EXPECT_EQ(random_resized_crop_box(100, 1000, rng), (CropBox{433, 0, 133, 100}));
}

TEST(RandomResizedCrop, RealGeneratorBoxesAlwaysInsideAndInRange) {
  Rng rng(123);
  for (int i = 0; i < 20000; ++i) {
    const int w = 16 + int(rng.next() % 600), h = 16 + int(rng.next() % 600);
    const CropBox b = random_resized_crop_box(w, h, rng);
    ASSERT_GT(b.width, 0);
    ASSERT_GT(b.height, 0);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.left + b.width, w);
    ASSERT_LE(b.top + b.height, h);
  }
}

TEST(ResizedCrop, SameSizeIsExactCopy) {
  const Image img = random_image(13, 9, 1);
  const auto out = resized_crop(img, {2, 3, 5, 7}, 7, 5);
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 7; ++x)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(out[(y * 7 + x) * 3 + c], img.at(2 + y, 3 + x, c));
}

TEST(ResizedCrop, HalvingAveragesWithTriangleKernel) {
  // 4 -> 2 per axis: scale 2, support 2; output 0 centre 1.0 taps x = 0,1,2 with weights
  // 1-|x+0.5-1|/2 = 0.75, 0.75, 0.25 (x = 3 is outside the support) -> normalised by 1.75.
  Image img{4, 1, {}};
  const uint8_t v[4] = {10, 50, 90, 130};
  for (uint8_t p : v) img.rgb.insert(img.rgb.end(), {p, p, p});
  const auto out = resized_crop(img, {0, 0, 1, 4}, 2, 1);
  EXPECT_NEAR(out[0], (0.75 * 10 + 0.75 * 50 + 0.25 * 90) / 1.75, 1e-4);
  EXPECT_NEAR(out[3], (0.25 * 50 + 0.75 * 90 + 0.75 * 130) / 1.75, 1e-4);
}

TEST(ResizedCrop, UpscaleIsHalfPixelBilinearClampedAtTheCropEdge) {
  // 2 -> 4: scale 0.5, support 1; output centres 0.25, 0.75, 1.25, 1.75 in input units.
  Image img = random_image(6, 1, 3);
  const auto out = resized_crop(img, {0, 2, 1, 2}, 4, 1);  // the crop holds columns 2 and 3
  for (int c = 0; c < 3; ++c) {
    const float a = img.at(0, 2, c), b = img.at(0, 3, c);
    EXPECT_NEAR(out[0 * 3 + c], a, 1e-4);  // only tap 0 in range: edge clamps to the crop
    EXPECT_NEAR(out[1 * 3 + c], 0.75f * a + 0.25f * b, 1e-3);
    EXPECT_NEAR(out[2 * 3 + c], 0.25f * a + 0.75f * b, 1e-3);
    EXPECT_NEAR(out[3 * 3 + c], b, 1e-4);
  }
}

TEST(Normalize, MeanStdFlipAndHalfOutput) {
  const int w = 3, h = 2;
  std::vector<float> hwc(w * h * 3);
  for (size_t i = 0; i < hwc.size(); ++i) hwc[i] = float(i * 13 % 256);
  AugmentSpec spec;
  std::vector<float> plain(hwc.size(), NAN), flipped(hwc.size(), NAN);
  normalize_into(hwc, w, h, false, spec, plain.data());
  normalize_into(hwc, w, h, true, spec, flipped.data());
  std::vector<uint16_t> half(hwc.size(), 0xFFFF);
  spec.out = gpulab::core::DType::f16;
  normalize_into(hwc, w, h, true, spec, half.data());
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const float want = (hwc[(y * w + x) * 3 + c] / 255.f - mean[c]) / stdv[c];
        EXPECT_NEAR(plain[(y * w + x) * 3 + c], want, 1e-6);
        const size_t m = (y * w + (w - 1 - x)) * 3 + c;
        EXPECT_NEAR(flipped[m], want, 1e-6);
        EXPECT_EQ(half[m], gpulab::core::float_to_f16_bits(flipped[m]));
      }
}

TEST(Augment, TrainIsDeterministicPerSeedAndFlipsHalfTheTime) {
  const Image img = random_image(120, 90, 5);
  AugmentSpec spec;
  spec.size = 32;
  std::vector<float> a(32 * 32 * 3, NAN), b(32 * 32 * 3, NAN);
  Rng r1(99), r2(99);
  augment_train(img, r1, spec, a.data());
  augment_train(img, r2, spec, b.data());
  EXPECT_EQ(a, b);
  for (float v : a) ASSERT_TRUE(std::isfinite(v) && v > -2.2f && v < 2.7f);
  // The draw order is crop then flip: replaying it by hand reproduces the output.
  Rng r3(99);
  const CropBox box = random_resized_crop_box(120, 90, r3);
  const bool flip = r3.uniform() < 0.5;
  std::vector<float> c(a.size(), NAN);
  normalize_into(resized_crop(img, box, 32, 32), 32, 32, flip, spec, c.data());
  EXPECT_EQ(a, c);
  int flips = 0;
  Rng r4(1);
  for (int i = 0; i < 2000; ++i) {
    random_resized_crop_box(120, 90, r4);
    flips += r4.uniform() < 0.5;
  }
  EXPECT_NEAR(flips, 1000, 100);
}

TEST(Augment, EvalResizesShorterSideThenCentreCrops) {
  // 64x48 with size 28: Resize(32) -> 42x32 (int(32*64/48) = 42), CenterCrop(28): left 7, top 2.
  const Image img = random_image(64, 48, 8);
  AugmentSpec spec;
  spec.size = 28;
  std::vector<float> out(28 * 28 * 3, NAN);
  augment_eval(img, spec, out.data());
  const auto resized = resized_crop(img, {0, 0, 48, 64}, 42, 32);
  std::vector<float> crop;
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x)
      for (int c = 0; c < 3; ++c) crop.push_back(resized[((y + 2) * 42 + x + 7) * 3 + c]);
  std::vector<float> want(out.size(), NAN);
  normalize_into(crop, 28, 28, false, spec, want.data());
  EXPECT_EQ(out, want);
}
