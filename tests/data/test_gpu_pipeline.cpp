// Host-side parts of the GPU pipeline: the sampling shared with the CPU loader, header checks
// that find corrupt files before decoding, and resize-job geometry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "common/temp_dir.h"
#include "data/dataset.h"
#include "data/gpu_augment.h"
#include "data/gpu_decode.h"
#include "data/jpeg.h"
#include "data/load_rate.h"
#include "data/sampling.h"

using namespace gpulab::data;

namespace {

Image noise_image(int w, int h, uint64_t seed) {
  Rng rng(seed);
  Image img{w, h, std::vector<uint8_t>(size_t(w) * h * 3)};
  for (auto& v : img.rgb) v = uint8_t(rng.next());
  return img;
}

// A JPEG whose APP1 segment carries a complete small JPEG (as an EXIF thumbnail does), so the
// thumbnail's own SOS and EOI markers sit before the main image's.
std::vector<uint8_t> jpeg_with_thumbnail(const Image& main_image) {
  const std::vector<uint8_t> main = encode_jpeg(main_image);
  const std::vector<uint8_t> thumb = encode_jpeg(noise_image(8, 8, 5));
  const size_t len = thumb.size() + 2;
  std::vector<uint8_t> out = {0xFF, 0xD8, 0xFF, 0xE1, uint8_t(len >> 8), uint8_t(len & 0xFF)};
  out.insert(out.end(), thumb.begin(), thumb.end());
  out.insert(out.end(), main.begin() + 2, main.end());  // the main image after its SOI
  return out;
}

}  // namespace

TEST(Sampling, TrainOrderIsASeededPermutationEvalIsFileOrder) {
  const std::vector<int64_t> a = epoch_order(1000, 7, 0, true);
  EXPECT_EQ(a, epoch_order(1000, 7, 0, true));
  EXPECT_NE(a, epoch_order(1000, 7, 1, true));
  EXPECT_NE(a, epoch_order(1000, 8, 0, true));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[size_t(i)], i);
  const std::vector<int64_t> eval = epoch_order(50, 7, 3, false);
  for (int64_t i = 0; i < 50; ++i) ASSERT_EQ(eval[size_t(i)], i);
}

TEST(Sampling, BatchesPerEpoch) {
  EXPECT_EQ(batches_per_epoch(24, 5, true), 4);
  EXPECT_EQ(batches_per_epoch(24, 5, false), 5);
  EXPECT_EQ(batches_per_epoch(3, 5, true), 1);  // never zero
}

TEST(Sampling, DrawTrainIsWhatAugmentTrainUses) {
  // augment_train == resized_crop of draw_train's box, mirrored by its flip.
  AugmentSpec spec;
  spec.size = 24;
  const Image img = noise_image(90, 70, 3);
  for (uint64_t position = 0; position < 20; ++position) {
    Rng r1 = augment_rng(5, 1, int64_t(position)), r2 = augment_rng(5, 1, int64_t(position));
    std::vector<float> got(24 * 24 * 3), want(24 * 24 * 3);
    augment_train(img, r1, spec, got.data());
    const TrainDraw d = draw_train(90, 70, r2, spec);
    normalize_into(resized_crop(img, d.box, 24, 24), 24, 24, d.flip, spec, want.data());
    ASSERT_EQ(got, want) << position;
  }
}

TEST(Sampling, EvalGeometryRoundsHalfToEvenLikeTorchvision) {
  // 500x375: shorter side -> 256, longer int(256 * 500 / 375) = 341; crop offsets
  // round((256 - 224) / 2) = 16 and round((341 - 224) / 2) = round(58.5) = 58.
  const EvalGeometry g = eval_geometry(500, 375, 224);
  EXPECT_EQ(g.resize_w, 341);
  EXPECT_EQ(g.resize_h, 256);
  EXPECT_EQ(g.top, 16);
  EXPECT_EQ(g.left, 58);
  const EvalGeometry tall = eval_geometry(375, 500, 224);
  EXPECT_EQ(tall.resize_w, 256);
  EXPECT_EQ(tall.resize_h, 341);
  EXPECT_EQ(tall.top, 58);
}

TEST(ResizeJob, TrainAndEvalJobsDescribeTheCpuTransforms) {
  const uint8_t* src = reinterpret_cast<const uint8_t*>(0x1000);
  const ResizeJob t = train_job(src, 500, 375, {{10, 20, 300, 200}, true}, 224);
  EXPECT_EQ(t.box, (CropBox{10, 20, 300, 200}));
  EXPECT_EQ(t.resize_w, 224);
  EXPECT_EQ(t.resize_h, 224);
  EXPECT_EQ(t.top, 0);
  EXPECT_EQ(t.left, 0);
  EXPECT_EQ(t.flip, 1);
  EXPECT_NO_THROW(check_job(t, 224));
  const ResizeJob e = eval_job(src, 500, 375, 224);
  EXPECT_EQ(e.box, (CropBox{0, 0, 375, 500}));
  EXPECT_EQ(e.resize_w, 341);
  EXPECT_EQ(e.top, 16);
  EXPECT_EQ(e.left, 58);
  EXPECT_EQ(e.flip, 0);
  EXPECT_NO_THROW(check_job(e, 224));
  ResizeJob bad = t;
  bad.box.left = 301;  // 301 + 200 > 500
  EXPECT_THROW(check_job(bad, 224), gpulab::core::InputError);
  bad = e;
  bad.left = 118;  // 118 + 224 > 341
  EXPECT_THROW(check_job(bad, 224), gpulab::core::InputError);
}

TEST(ResizeJob, KernelPixelFormulaMatchesResizedCropOnTheHost) {
  // resize_pixel is the kernel's body: on the host it must reproduce resized_crop (train: the
  // drawn box, mirrored; eval: the resized image's centre window) element for element.
  Rng rng(17);
  AugmentSpec spec;
  for (const auto& [w, h, size] : std::vector<std::tuple<int, int, int>>{{500, 375, 224}, {61, 97, 37}, {300, 40, 32}}) {
    const Image img = noise_image(w, h, uint64_t(w * h));
    spec.size = size;
    for (int trial = 0; trial < 4; ++trial) {
      const TrainDraw d{draw_train(w, h, rng, spec).box, trial % 2 == 1};
      const bool eval = trial == 3;
      const ResizeJob job = eval ? eval_job(img.rgb.data(), w, h, size) : train_job(img.rgb.data(), w, h, d, size);
      check_job(job, size);
      std::vector<float> want;
      if (eval) {
        const EvalGeometry g = eval_geometry(w, h, size);
        const std::vector<float> full = resized_crop(img, {0, 0, h, w}, g.resize_w, g.resize_h);
        for (int y = 0; y < size; ++y)
          for (int x = 0; x < size; ++x)
            for (int c = 0; c < 3; ++c) want.push_back(full[(size_t(g.top + y) * g.resize_w + g.left + x) * 3 + c]);
      } else {
        const std::vector<float> crop = resized_crop(img, d.box, size, size);
        for (int y = 0; y < size; ++y)
          for (int x = 0; x < size; ++x)
            for (int c = 0; c < 3; ++c) want.push_back(crop[(size_t(y) * size + (d.flip ? size - 1 - x : x)) * 3 + c]);
      }
      int64_t bad = 0;
      for (int y = 0; y < size; ++y)
        for (int x = 0; x < size; ++x) {
          float rgb[3];
          resize_pixel(job, size, x, y, rgb);
          for (int c = 0; c < 3; ++c)
            if (std::abs(rgb[c] - want[(size_t(y) * size + x) * 3 + c]) > 1e-3f && ++bad <= 3)
              ADD_FAILURE() << w << "x" << h << " trial " << trial << " pixel (" << x << ", " << y << ") channel " << c
                            << ": " << rgb[c] << " vs " << want[(size_t(y) * size + x) * 3 + c];
        }
      EXPECT_EQ(bad, 0) << w << "x" << h << " trial " << trial;
    }
  }
}

TEST(JpegHeader, SizeWithoutDecoding) {
  const std::vector<uint8_t> bytes = encode_jpeg(noise_image(37, 23, 1));
  const JpegSize s = read_jpeg_header(bytes, "x");
  EXPECT_EQ(s.width, 37);
  EXPECT_EQ(s.height, 23);
}

TEST(JpegHeader, RejectsWhatTheCpuDecoderRejectsBeforeTheData) {
  const std::vector<uint8_t> good = encode_jpeg(noise_image(64, 48, 2));
  EXPECT_THROW(read_jpeg_header({}, "empty"), CorruptImageError);
  const std::vector<uint8_t> junk = {'n', 'o', 't', ' ', 'a', ' ', 'j', 'p', 'e', 'g'};
  EXPECT_THROW(read_jpeg_header(junk, "junk"), CorruptImageError);
  // Every truncation inside the scan data is caught (an interrupted download), as TurboJPEG does.
  for (size_t cut : {good.size() / 2, good.size() - 2, good.size() - 1}) {
    const std::vector<uint8_t> part(good.begin(), good.begin() + long(cut));
    EXPECT_THROW(read_jpeg_header(part, "cut"), CorruptImageError) << cut;
    EXPECT_THROW(decode_jpeg(part, "cut"), CorruptImageError) << cut;
  }
  // Bytes after the end-of-image marker are harmless to both.
  std::vector<uint8_t> padded = good;
  padded.insert(padded.end(), 100, 0);
  EXPECT_NO_THROW(read_jpeg_header(padded, "padded"));
  EXPECT_NO_THROW(decode_jpeg(padded, "padded"));
}

TEST(JpegHeader, ThumbnailMarkersDoNotHideATruncatedMainImage) {
  const Image img = noise_image(64, 48, 4);
  const std::vector<uint8_t> whole = jpeg_with_thumbnail(img);
  const Image decoded = decode_jpeg(whole, "whole");
  EXPECT_EQ(decoded.width, 64);
  const JpegSize s = read_jpeg_header(whole, "whole");
  EXPECT_EQ(s.width, 64);
  EXPECT_EQ(s.height, 48);
  const std::vector<uint8_t> cut(whole.begin(), whole.end() - long(whole.size() / 3));
  EXPECT_THROW(read_jpeg_header(cut, "cut"), CorruptImageError);
  EXPECT_THROW(decode_jpeg(cut, "cut"), CorruptImageError);
}

TEST(JpegHeader, GarbledScanDataPassesTheHeaderCheckButNotTurboJpeg) {
  // What only a decoder finds (the premise of GpuLoader.GarbledScanDataNeverCrashes).
  std::vector<uint8_t> bytes = encode_jpeg(noise_image(160, 120, 6));
  Rng rng(3);
  for (size_t i = bytes.size() / 2; i < bytes.size() * 3 / 4; ++i) bytes[i] = uint8_t(rng.next() % 0xFF);
  const JpegSize s = read_jpeg_header(bytes, "garbled");
  EXPECT_EQ(s.width, 160);
  EXPECT_THROW(decode_jpeg(bytes, "garbled"), CorruptImageError);
}

TEST(BatchDecoder, BuildReportsWhetherNvjpegIsAvailable) {
#ifdef GPULAB_HAVE_NVJPEG
  EXPECT_TRUE(nvjpeg_built());
#else
  EXPECT_FALSE(nvjpeg_built());
  try {
    make_batch_decoder(DecodeBackend::nvjpeg, 1);
    FAIL() << "asking for nvJPEG in a build without it must fail";
  } catch (const gpulab::core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("nvJPEG not found at build time"), std::string::npos) << e.what();
  }
  // The GPU pipeline's default then decodes on the CPU and says why.
  EXPECT_EQ(make_batch_decoder(DecodeBackend::automatic, 1)->name(),
            "TurboJPEG (CPU) + upload (nvJPEG not found at build time)");
#endif
  EXPECT_EQ(make_batch_decoder(DecodeBackend::cpu, 2)->name(), "TurboJPEG (CPU) + upload");
}

TEST(LoadRate, TimesTheCpuPipelineAlone) {
  gpulab::testing::TempDir t("load_rate");
  MakeOptions mo;
  mo.classes = 2;
  mo.train_images = 6;
  mo.val_images = 1;
  mo.width = 64;
  mo.height = 48;
  make_dataset(t.path, mo);
  LoadRateOptions opt;
  opt.pipeline = "cpu";
  opt.batch = 4;
  opt.batches = 5;  // crosses an epoch (3 batches of 4 in 12 images)
  opt.warmup = 1;
  opt.threads = 2;
  opt.size = 16;
  const LoadRate r = measure_load_rate(t.path, opt);
  EXPECT_EQ(r.images, 20);
  EXPECT_GT(r.seconds, 0);
  EXPECT_NEAR(r.images_per_second, 20 / r.seconds, 1e-9);
  EXPECT_TRUE(r.decoder.empty());
  opt.pipeline = "tpu";
  EXPECT_THROW(measure_load_rate(t.path, opt), gpulab::core::InputError);
}
