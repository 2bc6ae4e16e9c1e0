// dataset make / scan, folder listing, and the loader (order, determinism, corrupt files).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "common/temp_dir.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/folder.h"
#include "data/loader.h"

using namespace gpulab::data;
namespace fs = std::filesystem;

namespace {

using gpulab::testing::TempDir;

MakeOptions small_options() {
  MakeOptions opt;
  opt.classes = 4;
  opt.train_images = 6;
  opt.val_images = 2;
  opt.width = 64;
  opt.height = 48;
  opt.seed = 11;
  opt.threads = 2;
  return opt;
}

std::vector<uint8_t> bytes_of(const fs::path& p) { return read_file_bytes(p); }

}  // namespace

TEST(DatasetMake, WritesImageNetLayoutDeterministically) {
  TempDir a("make_a"), b("make_b");
  const MakeOptions opt = small_options();
  const MakeReport r = make_dataset(a.path, opt);
  EXPECT_EQ(r.files, 4 * (6 + 2));
  make_dataset(b.path, opt);
  const ImageFolder train = scan_image_folder(a.path / "train");
  ASSERT_EQ(train.classes.size(), 4u);
  EXPECT_EQ(train.classes[0], "c0000_red_circle");
  EXPECT_EQ(train.classes[1], "c0001_red_square");
  ASSERT_EQ(train.samples.size(), 24u);
  for (size_t i = 0; i < train.samples.size(); ++i) {
    EXPECT_EQ(train.samples[i].label, int(i / 6));
    const fs::path rel = fs::relative(train.samples[i].path, a.path);
    EXPECT_EQ(bytes_of(train.samples[i].path), bytes_of(b.path / rel)) << rel;
    const Image img = read_jpeg(train.samples[i].path);
    EXPECT_EQ(img.width, 64);
    EXPECT_EQ(img.height, 48);
  }
  EXPECT_EQ(scan_image_folder(a.path / "val").samples.size(), 8u);
  // A different seed gives different images; an existing non-empty folder is refused.
  MakeOptions other = opt;
  other.seed = 12;
  EXPECT_NE(synthetic_image(opt, 0, 0).rgb, synthetic_image(other, 0, 0).rgb);
  EXPECT_THROW(make_dataset(a.path, opt), gpulab::core::InputError);
}

TEST(DatasetMake, ShapesAreLearnableByColourAndShape) {
  // The shape's colour dominates the class: the brightest channel's mean differs by class colour.
  MakeOptions opt = small_options();
  opt.width = opt.height = 96;
  auto mean_rgb = [&](int label) {
    double s[3] = {0, 0, 0};
    for (uint64_t i = 0; i < 8; ++i) {
      const Image img = synthetic_image(opt, label, i);
      for (size_t p = 0; p < img.rgb.size(); ++p) s[p % 3] += img.rgb[p];
    }
    return std::array<double, 3>{s[0], s[1], s[2]};
  };
  const auto red = mean_rgb(0), green = mean_rgb(6), blue = mean_rgb(12);  // circle in 3 colours
  EXPECT_GT(red[0], red[1] * 1.2);
  EXPECT_GT(green[1], green[0] * 1.2);
  EXPECT_GT(blue[2], blue[0] * 1.2);
  // Same colour, different shape: the classes' images differ.
  const auto square = mean_rgb(1), ring = mean_rgb(4);
  EXPECT_NE(square[0], ring[0]);
  opt.classes = max_shape_classes() + 1;
  TempDir t("make_many");
  EXPECT_THROW(make_dataset(t.path, opt), gpulab::core::InputError);
}

TEST(DatasetScan, CountsClassesAndCatchesPlantedCorruptFiles) {
  TempDir t("scan");
  make_dataset(t.path, small_options());
  const fs::path victim = t.path / "train" / "c0002_red_triangle" / "img_000003.JPEG";
  auto bytes = bytes_of(victim);
  bytes.resize(bytes.size() / 2);  // truncated, as an interrupted download
  std::ofstream(victim, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const fs::path junk = t.path / "val" / "c0001_red_square" / "zz_text.jpg";
  std::ofstream(junk) << "not a jpeg";
  std::ofstream(t.path / "train" / "c0000_red_circle" / "README.txt") << "ignored: not a JPEG name";

  const ScanReport r = scan_dataset(t.path, 3);
  ASSERT_EQ(r.splits.size(), 2u);
  EXPECT_EQ(r.splits[0].name, "train");
  EXPECT_EQ(r.splits[0].images, 24);
  EXPECT_EQ(r.splits[0].counts, (std::vector<int64_t>{6, 6, 6, 6}));
  EXPECT_EQ(r.splits[1].name, "val");
  EXPECT_EQ(r.splits[1].counts, (std::vector<int64_t>{2, 3, 2, 2}));
  ASSERT_EQ(r.corrupt.size(), 2u);
  EXPECT_EQ(r.corrupt[0].path, victim.string());
  EXPECT_EQ(r.corrupt[1].path, junk.string());
  EXPECT_EQ(r.decoded, 24 + 9 - 2);
  EXPECT_NEAR(r.megapixels, 31 * 64 * 48 * 1e-6, 1e-9);
  EXPECT_GT(r.images_per_second(), 0);
}

TEST(Folder, EmptyOrMissingDatasetIsAClearError) {
  TempDir t("empty");
  EXPECT_THROW(scan_image_folder(t.path), gpulab::core::InputError);  // missing
  fs::create_directories(t.path / "classA");
  try {
    scan_image_folder(t.path);
    FAIL();
  } catch (const gpulab::core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no .JPEG"), std::string::npos) << e.what();
  }
  fs::remove_all(t.path / "classA");
  EXPECT_THROW(scan_image_folder(t.path), gpulab::core::InputError);  // no class folders
  EXPECT_THROW(scan_dataset(t.path, 1), gpulab::core::InputError);
}

TEST(Loader, SameSeedSameBatchesWhateverTheThreadCount) {
  TempDir t("loader");
  make_dataset(t.path, small_options());
  const ImageFolder folder = scan_image_folder(train_split(t.path));
  LoaderOptions opt;
  opt.batch = 5;
  opt.seed = 3;
  opt.augment.size = 16;
  opt.threads = 1;
  Loader one(folder, opt);
  opt.threads = 4;
  opt.prefetch = 3;
  Loader four(folder, opt);
  EXPECT_EQ(one.batches_per_epoch(), 4);  // 24 images / 5, the rest wraps
  std::vector<int> seen(24, 0);
  std::vector<std::vector<std::byte>> epoch0;
  for (int i = 0; i < 9; ++i) {  // crosses two epoch boundaries
    const Batch& a = one.next();
    const Batch& b = four.next();
    ASSERT_EQ(a.index, i);
    EXPECT_EQ(a.epoch, i / 4);
    ASSERT_EQ(a.labels, b.labels);
    ASSERT_EQ(a.images, b.images);
    ASSERT_EQ(a.images.size(), size_t(5) * 16 * 16 * 3 * 4);
    if (i < 4) {
      epoch0.push_back(a.images);
      for (int32_t l : a.labels) ++seen[l];
    } else if (i < 8) {
      EXPECT_NE(a.images, epoch0[i - 4]);  // a new shuffle and new crops each epoch
    }
    const float* px = reinterpret_cast<const float*>(a.images.data());
    for (size_t k = 0; k < a.images.size() / 4; ++k) ASSERT_TRUE(std::isfinite(px[k]));
  }
  // Epoch 0 draws 20 distinct images: 5 from each class at most 6, labels all valid.
  int total = 0;
  for (int c = 0; c < 4; ++c) total += seen[c];
  EXPECT_EQ(total, 20);
  opt.seed = 4;
  Loader other(folder, opt);
  EXPECT_NE(other.next().images, epoch0[0]);
}

// A resumed training run starts its loader at a later batch: the same bytes as reaching it.
TEST(Loader, StartingAtABatchGivesTheSameBatchesAsReachingIt) {
  TempDir t("loader_start");
  make_dataset(t.path, small_options());
  const ImageFolder folder = scan_image_folder(train_split(t.path));
  LoaderOptions opt;
  opt.batch = 5;
  opt.seed = 3;
  opt.augment.size = 16;
  opt.threads = 3;
  Loader from_start(folder, opt);
  std::vector<Batch> all;
  for (int i = 0; i < 11; ++i) all.push_back(from_start.next());
  for (const int64_t first : {1, 4, 6}) {  // an epoch's start and the middle of the second
    SCOPED_TRACE(first);
    opt.first_batch = first;
    Loader resumed(folder, opt);
    for (int64_t i = first; i < 11; ++i) {
      const Batch& b = resumed.next();
      ASSERT_EQ(b.index, i);
      EXPECT_EQ(b.epoch, i / 4);
      ASSERT_EQ(b.labels, all[size_t(i)].labels);
      ASSERT_EQ(b.images, all[size_t(i)].images);
    }
  }
}

TEST(Loader, CorruptFileIsSkippedAndCounted) {
  TempDir t("loader_bad");
  MakeOptions mo = small_options();
  mo.classes = 2;
  mo.train_images = 4;  // 8 images
  make_dataset(t.path, mo);
  const fs::path victim = t.path / "train" / "c0001_red_square" / "img_000002.JPEG";
  std::ofstream(victim, std::ios::trunc) << "broken";
  LoaderOptions opt;
  opt.batch = 4;
  opt.threads = 2;
  opt.augment.size = 8;
  Loader loader(scan_image_folder(t.path / "train"), opt);
  int skipped = 0;
  for (int i = 0; i < 2; ++i) skipped += loader.next().skipped;  // one full epoch
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(loader.skipped_total(), 1);
  EXPECT_EQ(loader.corrupt_files(), std::vector<std::string>{victim.string()});
}

TEST(Loader, AllCorruptIsAnErrorNotAHang) {
  TempDir t("loader_all_bad");
  fs::create_directories(t.path / "a");
  for (int i = 0; i < 3; ++i) std::ofstream(t.path / "a" / ("x" + std::to_string(i) + ".jpg")) << "nope";
  LoaderOptions opt;
  opt.batch = 2;
  opt.threads = 2;
  opt.augment.size = 8;
  Loader loader(scan_image_folder(t.path), opt);
  EXPECT_THROW(loader.next(), gpulab::core::InputError);
}

TEST(Loader, EvalModeVisitsEveryImageOnceInFileOrder) {
  TempDir t("loader_eval");
  make_dataset(t.path, small_options());  // 4 classes x 6 train images
  const ImageFolder folder = scan_image_folder(t.path / "train");
  LoaderOptions opt;
  opt.batch = 5;
  opt.threads = 3;
  opt.train = false;
  opt.augment.size = 8;
  Loader loader(folder, opt);
  ASSERT_EQ(loader.batches_per_epoch(), 5);  // ceil(24 / 5)
  std::vector<int32_t> labels;
  for (int b = 0; b < 5; ++b) {
    const Batch& batch = loader.next();
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  }
  for (int i = 0; i < 24; ++i) EXPECT_EQ(labels[i], i / 6) << i;
  EXPECT_EQ(labels[24], 0);  // the last batch wraps to the first image
  // The eval transform is deterministic: the first image equals augment_eval of the file.
  Loader again(folder, opt);
  const Batch& b = again.next();
  std::vector<float> want(8 * 8 * 3);
  augment_eval(read_jpeg(folder.samples[0].path), opt.augment, want.data());
  EXPECT_EQ(0, std::memcmp(b.images.data(), want.data(), want.size() * 4));
}

TEST(Loader, ShardedRanksReadTheUnshardedBatchesInTurn) {
  TempDir t("loader_shard");
  make_dataset(t.path, small_options());  // 24 train images
  const ImageFolder folder = scan_image_folder(train_split(t.path));
  LoaderOptions opt;
  opt.batch = 3;
  opt.seed = 9;
  opt.augment.size = 16;
  opt.threads = 2;
  Loader whole(folder, opt);
  std::vector<std::vector<std::byte>> images;
  std::vector<std::vector<int32_t>> labels;
  for (int i = 0; i < 12; ++i) {  // one and a half epochs of 8 batches
    const Batch& b = whole.next();
    images.push_back(b.images);
    labels.push_back(b.labels);
  }
  for (int r = 0; r < 2; ++r) {
    opt.shard = {r, 2};
    Loader mine(folder, opt);
    EXPECT_EQ(mine.batches_per_epoch(), 4);
    for (int k = 0; k < 6; ++k) {
      const Batch& b = mine.next();
      EXPECT_EQ(b.epoch, k / 4);
      ASSERT_EQ(b.labels, labels[size_t(2 * k + r)]) << "rank " << r << " batch " << k;
      ASSERT_EQ(b.images, images[size_t(2 * k + r)]) << "rank " << r << " batch " << k;
    }
  }
  opt.train = false;
  EXPECT_THROW(Loader(folder, opt), gpulab::core::InputError);
}
