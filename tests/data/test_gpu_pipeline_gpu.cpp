// The GPU pipeline on a device: the resize kernel against the CPU augmentation, the GPU loader
// against the CPU loader batch for batch (same images, labels, crops), nvJPEG against TurboJPEG,
// corrupt files, reproducibility, and the consumer-stream handshake.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/gpu.h"
#include "common/temp_dir.h"
#include "core/dtype.h"
#include "core/memory.h"
#include "data/dataset.h"
#include "data/gpu_augment.h"
#include "data/gpu_decode.h"
#include "data/gpu_loader.h"
#include "data/load_rate.h"
#include "data/loader.h"

using namespace gpulab;
using namespace gpulab::data;
using gpulab::testing::TempDir;
namespace fs = std::filesystem;

namespace {

Image noise_image(int w, int h, uint64_t seed) {
  Rng rng(seed);
  Image img{w, h, std::vector<uint8_t>(size_t(w) * h * 3)};
  for (auto& v : img.rgb) v = uint8_t(rng.next());
  return img;
}

// `n` elements of type `dt` as floats.
std::vector<float> as_floats(const std::byte* p, size_t n, core::DType dt) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dt == core::DType::f32) {
      std::memcpy(&out[i], p + i * 4, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, p + i * 2, 2);
      out[i] = dt == core::DType::f16 ? core::f16_bits_to_float(bits) : core::bf16_bits_to_float(bits);
    }
  }
  return out;
}

std::vector<float> device_floats(const void* p, size_t n, core::DType dt) {
  std::vector<std::byte> host(n * core::dtype_size(dt));
  GPULAB_CHECK(cudaMemcpy(host.data(), p, host.size(), cudaMemcpyDeviceToHost));
  return as_floats(host.data(), n, dt);
}

// GPU loader options that hand out the batches the CPU loader `lo` hands out (same files, crops and
// flips), decoded by `decode`.
GpuLoaderOptions same_batches_as(const LoaderOptions& lo, DecodeBackend decode, int threads = 2) {
  GpuLoaderOptions go;
  go.batch = lo.batch;
  go.threads = threads;
  go.seed = lo.seed;
  go.train = lo.train;
  go.augment = lo.augment;
  go.decode = decode;
  go.shard = lo.shard;
  go.first_batch = lo.first_batch;
  return go;
}

// GPU loader options of the tests that use the GPU loader alone: batch, threads, seed, and the
// crop's size and type.
GpuLoaderOptions loader_options(int batch, int threads, uint64_t seed, int size, core::DType out) {
  GpuLoaderOptions go;
  go.batch = batch;
  go.threads = threads;
  go.seed = seed;
  go.augment.size = size;
  go.augment.out = out;
  return go;
}

// atol + rtol * |ref| per element, NaN/Inf fail; returns the number of mismatches (first few printed).
int64_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want, float atol, float rtol,
                         const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    if (!std::isfinite(got[i]) || std::abs(got[i] - want[i]) > atol + rtol * std::abs(want[i]))
      if (++bad <= 5) ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", want " << want[i];
  return bad;
}

double mean_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(double(a[i]) - b[i]);
  return a.empty() ? 0 : s / double(a.size());
}

MakeOptions dataset_options(int classes, int images, int width, int height) {
  MakeOptions mo;
  mo.classes = classes;
  mo.train_images = images;
  mo.val_images = 1;
  mo.width = width;
  mo.height = height;
  mo.seed = 21;
  mo.threads = 4;
  return mo;
}

// Keeps the first `keep` (a fraction) of the file: an interrupted download.
void truncate_file(const fs::path& path, double keep) {
  std::vector<uint8_t> bytes = read_file_bytes(path);
  bytes.resize(size_t(double(bytes.size()) * keep));
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(bytes.data()), long(bytes.size()));
}

struct Tol {
  float atol, rtol;
};
// The kernel computes what resized_crop() computes, in float, with fused multiply-adds: f32
// agrees to float rounding; f16/bf16 may round the other way at a tie, one unit in the last place.
Tol tolerance(core::DType dt) {
  if (dt == core::DType::f16) return {1e-4f, 1.f / 1024};
  if (dt == core::DType::bf16) return {1e-4f, 1.f / 128};
  return {1e-4f, 0};
}

}  // namespace

TEST(GpuAugment, KernelMatchesCpuAugmentationEveryDtype) {
  GPULAB_REQUIRE_GPU();
  const std::vector<std::pair<int, int>> sizes = {{500, 375}, {375, 500}, {97, 61}, {224, 224}, {1000, 80}, {31, 400}};
  for (int size : {224, 37}) {
    std::vector<Image> imgs;
    std::vector<core::DeviceBuffer<uint8_t>> dev;
    std::vector<ResizeJob> jobs;
    std::vector<std::pair<CropBox, bool>> train_draws;
    for (size_t i = 0; i < sizes.size(); ++i) {
      imgs.push_back(noise_image(sizes[i].first, sizes[i].second, 100 + i));
      dev.emplace_back(imgs.back().rgb.size());
      GPULAB_CHECK(cudaMemcpy(dev.back().get(), imgs.back().rgb.data(), imgs.back().rgb.size(), cudaMemcpyHostToDevice));
    }
    AugmentSpec spec;
    spec.size = size;
    Rng rng(7);
    for (size_t i = 0; i < imgs.size(); ++i) {  // a train job per image (a flip on every other), then an eval job
      TrainDraw d = draw_train(imgs[i].width, imgs[i].height, rng, spec);
      d.flip = i % 2 == 1;
      jobs.push_back(train_job(dev[i].get(), imgs[i].width, imgs[i].height, d, size));
      train_draws.emplace_back(d.box, d.flip);
    }
    for (size_t i = 0; i < imgs.size(); ++i) jobs.push_back(eval_job(dev[i].get(), imgs[i].width, imgs[i].height, size));
    core::DeviceBuffer<ResizeJob> djobs(jobs.size());
    GPULAB_CHECK(cudaMemcpy(djobs.get(), jobs.data(), jobs.size() * sizeof(ResizeJob), cudaMemcpyHostToDevice));
    const size_t per_image = size_t(size) * size * 3;
    for (core::DType dt : {core::DType::f32, core::DType::f16, core::DType::bf16}) {
      spec.out = dt;
      core::DeviceBuffer<std::byte> out(per_image * jobs.size() * core::dtype_size(dt));
      GPULAB_CHECK(cudaMemset(out.get(), 0xFF, out.bytes()));  // NaN in every float type
      resized_crop_normalize(djobs.get(), int(jobs.size()), spec, out.get(), nullptr);
      GPULAB_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = device_floats(out.get(), per_image * jobs.size(), dt);
      for (size_t j = 0; j < jobs.size(); ++j) {
        const Image& img = imgs[j % imgs.size()];
        std::vector<std::byte> want(per_image * core::dtype_size(dt));
        if (j < imgs.size())
          normalize_into(resized_crop(img, train_draws[j].first, size, size), size, size, train_draws[j].second, spec,
                         want.data());
        else
          augment_eval(img, spec, want.data());
        const std::vector<float> g(got.begin() + long(j * per_image), got.begin() + long((j + 1) * per_image));
        const Tol t = tolerance(dt);
        EXPECT_EQ(count_mismatches(g, as_floats(want.data(), per_image, dt), t.atol, t.rtol,
                                   std::string(core::dtype_name(dt)) + " size " + std::to_string(size) + " job " +
                                       std::to_string(j)),
                  0);
      }
    }
  }
}

TEST(GpuLoader, CpuDecodeMatchesTheCpuLoaderBatchForBatch) {
  GPULAB_REQUIRE_GPU();
  TempDir t("gpu_loader_cpu");
  make_dataset(t.path, dataset_options(3, 10, 200, 150));
  const ImageFolder folder = scan_image_folder(t.path / "train");
  for (bool train : {true, false}) {
    LoaderOptions lo;
    lo.batch = 8;
    lo.threads = 3;
    lo.seed = 9;
    lo.train = train;
    lo.augment.size = 32;
    const GpuLoaderOptions go = same_batches_as(lo, DecodeBackend::cpu);
    Loader cpu(folder, lo);
    GpuLoader gpu(folder, go);
    EXPECT_EQ(gpu.decoder_name(), "TurboJPEG (CPU) + upload");
    ASSERT_EQ(gpu.batches_per_epoch(), cpu.batches_per_epoch());
    core::Stream stream;
    const size_t n = size_t(lo.batch) * 32 * 32 * 3;
    for (int b = 0; b < 8; ++b) {  // crosses epochs and reuses every slot twice
      const Batch& want = cpu.next();
      const GpuBatch& got = gpu.next(stream);
      ASSERT_EQ(got.index, b);
      EXPECT_EQ(got.epoch, want.epoch);
      std::vector<int32_t> labels(size_t(lo.batch));
      GPULAB_CHECK(cudaMemcpyAsync(labels.data(), got.labels, labels.size() * 4, cudaMemcpyDeviceToHost, stream));
      std::vector<std::byte> images(n * 4);
      GPULAB_CHECK(cudaMemcpyAsync(images.data(), got.images, images.size(), cudaMemcpyDeviceToHost, stream));
      stream.synchronize();
      EXPECT_EQ(labels, want.labels) << "batch " << b;
      EXPECT_EQ(count_mismatches(as_floats(images.data(), n, core::DType::f32),
                                 as_floats(want.images.data(), n, core::DType::f32), 1e-4f, 0,
                                 std::string(train ? "train" : "eval") + " batch " + std::to_string(b)),
                0);
    }
  }
}

// A data-parallel rank's shard and a resumed run's start: the GPU loader reads what the CPU
// loader reads with the same options (the CPU loader's sharding and first batch are CPU-tested).
TEST(GpuLoader, ShardAndFirstBatchMatchTheCpuLoader) {
  GPULAB_REQUIRE_GPU();
  TempDir t("gpu_loader_shard");
  make_dataset(t.path, dataset_options(3, 12, 200, 150));
  const ImageFolder folder = scan_image_folder(t.path / "train");
  for (const Shard shard : {Shard{0, 2}, Shard{1, 2}})
    for (const int64_t first : {int64_t{0}, int64_t{3}}) {
      SCOPED_TRACE("rank " + std::to_string(shard.rank) + " of 2, first batch " + std::to_string(first));
      LoaderOptions lo;
      lo.batch = 4;
      lo.threads = 2;
      lo.seed = 11;
      lo.augment.size = 32;
      lo.shard = shard;
      lo.first_batch = first;
      const GpuLoaderOptions go = same_batches_as(lo, DecodeBackend::cpu);
      Loader cpu(folder, lo);
      GpuLoader gpu(folder, go);
      ASSERT_EQ(gpu.batches_per_epoch(), cpu.batches_per_epoch());
      core::Stream stream;
      const size_t n = size_t(lo.batch) * 32 * 32 * 3;
      for (int b = 0; b < 6; ++b) {  // crosses an epoch (4 batches a rank)
        const Batch& want = cpu.next();
        const GpuBatch& got = gpu.next(stream);
        EXPECT_EQ(got.index, first + b);
        EXPECT_EQ(got.epoch, want.epoch);
        std::vector<int32_t> labels(size_t(lo.batch));
        GPULAB_CHECK(cudaMemcpyAsync(labels.data(), got.labels, labels.size() * 4, cudaMemcpyDeviceToHost, stream));
        std::vector<std::byte> images(n * 4);
        GPULAB_CHECK(cudaMemcpyAsync(images.data(), got.images, images.size(), cudaMemcpyDeviceToHost, stream));
        stream.synchronize();
        EXPECT_EQ(labels, want.labels) << "batch " << b;
        EXPECT_EQ(count_mismatches(as_floats(images.data(), n, core::DType::f32),
                                   as_floats(want.images.data(), n, core::DType::f32), 1e-4f, 0,
                                   "batch " + std::to_string(b)),
                  0);
      }
    }
}

TEST(GpuLoader, NvjpegDecodeIsCloseToTurboJpeg) {
  GPULAB_REQUIRE_GPU();
  if (!nvjpeg_built()) GTEST_SKIP() << "gpulab was built without nvJPEG";
  TempDir t("nvjpeg_decode");
  make_dataset(t.path, dataset_options(4, 6, 500, 375));
  const ImageFolder folder = scan_image_folder(t.path / "train");
  std::vector<std::vector<uint8_t>> files;
  std::vector<EncodedJpeg> jpegs;
  std::vector<Image> want;
  for (const Sample& s : folder.samples) files.push_back(read_file_bytes(s.path));
  for (size_t i = 0; i < files.size(); ++i) {
    want.push_back(decode_jpeg(files[i], folder.samples[i].path.string()));
    jpegs.push_back({files[i], want.back().width, want.back().height});
  }
  const size_t bytes = want[0].rgb.size();
  const size_t stride = (bytes + 255) / 256 * 256;  // as the loader lays images out
  // Also with the hardware engines switched off (GPULAB_NVJPEG_HARDWARE=0, the escape from an engine fault).
  for (const bool hardware_off : {false, true}) {
    SCOPED_TRACE(hardware_off ? "GPULAB_NVJPEG_HARDWARE=0" : "hardware engines allowed");
    if (!hardware_off && sanitizer_tool() == "initcheck") {  // it cannot see the engines' writes
      std::cout << "under initcheck: the GPU-hybrid backend only\n";
      continue;
    }
    if (hardware_off) setenv("GPULAB_NVJPEG_HARDWARE", "0", 1);
    else unsetenv("GPULAB_NVJPEG_HARDWARE");
    core::DeviceBuffer<uint8_t> out(stride * files.size());
    GPULAB_CHECK(cudaMemset(out.get(), 0xA5, out.bytes()));  // poisoned: an image left unwritten fails
    std::vector<uint8_t*> dst;
    for (size_t i = 0; i < files.size(); ++i) dst.push_back(out.get() + i * stride);
    auto decoder = make_batch_decoder(DecodeBackend::nvjpeg, 2);
    std::cout << "decoder: " << decoder->name() << "\n";
    core::Stream stream;
    const std::vector<char> ok = decoder->decode(jpegs, dst, stream);
    stream.synchronize();
    const DecodeStats st = decoder->stats();
    std::cout << "decoded: hardware " << st.hardware << ", GPU hybrid " << st.gpu_hybrid << ", CPU " << st.cpu << "\n";
    EXPECT_EQ(st.cpu, 0) << "baseline 4:2:0 JPEGs should all decode on the GPU";
    if (hardware_off) {
      EXPECT_NE(decoder->name().find("GPULAB_NVJPEG_HARDWARE=0"), std::string::npos) << decoder->name();
      EXPECT_EQ(st.hardware, 0);
      EXPECT_EQ(st.gpu_hybrid, int64_t(files.size()));
    } else if (decoder->name().find("hardware") != std::string::npos) {
      EXPECT_EQ(st.hardware, int64_t(files.size())) << "the hardware engines should take baseline JPEGs";
    }
    std::vector<uint8_t> got(out.size());
    GPULAB_CHECK(cudaMemcpy(got.data(), out.get(), got.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < files.size(); ++i) {
      ASSERT_TRUE(ok[i]) << i;
      double sum = 0;
      int64_t far = 0;
      int worst = 0;
      for (size_t k = 0; k < bytes; ++k) {
        const int d = std::abs(int(got[i * stride + k]) - int(want[i].rgb[k]));
        sum += d;
        far += d > 24;
        worst = std::max(worst, d);
      }
      // The IDCTs and chroma upsampling differ slightly: small on average, large only at a few colour edges.
      EXPECT_LE(sum / double(bytes), 1.5) << "image " << i << " (max " << worst << ")";
      EXPECT_LE(double(far) / double(bytes), 0.01) << "image " << i;
    }
  }
  unsetenv("GPULAB_NVJPEG_HARDWARE");
}

TEST(GpuLoader, NvjpegPipelineMatchesTheCpuLoader) {
  GPULAB_REQUIRE_GPU();
  if (!nvjpeg_built()) GTEST_SKIP() << "gpulab was built without nvJPEG";
  TempDir t("gpu_loader_nvjpeg");
  make_dataset(t.path, dataset_options(3, 12, 500, 375));
  const ImageFolder folder = scan_image_folder(t.path / "train");
  LoaderOptions lo;
  lo.batch = 16;
  lo.threads = 4;
  lo.seed = 5;
  lo.augment.size = 224;
  const GpuLoaderOptions go = same_batches_as(lo, DecodeBackend::nvjpeg, 4);
  Loader cpu(folder, lo);
  GpuLoader gpu(folder, go);
  core::Stream stream;
  const size_t n = size_t(lo.batch) * 224 * 224 * 3;
  for (int b = 0; b < 4; ++b) {
    const Batch& want = cpu.next();
    const GpuBatch& got = gpu.next(stream);
    std::vector<int32_t> labels(size_t(lo.batch));
    GPULAB_CHECK(cudaMemcpyAsync(labels.data(), got.labels, labels.size() * 4, cudaMemcpyDeviceToHost, stream));
    stream.synchronize();
    EXPECT_EQ(labels, want.labels) << "batch " << b;
    const std::vector<float> g = device_floats(got.images, n, core::DType::f32);
    const std::vector<float> w = as_floats(want.images.data(), n, core::DType::f32);
    for (float v : g) ASSERT_TRUE(std::isfinite(v));
    // About 1.5 grey levels (/255/0.225): decoder differences only; a wrong crop or flip is ~0.5.
    EXPECT_LE(mean_abs_diff(g, w), 0.03) << "batch " << b;
  }
}

TEST(GpuLoader, CorruptFilesAreSkippedAsTheCpuLoaderSkipsThem) {
  GPULAB_REQUIRE_GPU();
  TempDir t("gpu_loader_corrupt");
  make_dataset(t.path, dataset_options(2, 6, 160, 120));
  const fs::path junk = t.path / "train" / "c0000_red_circle" / "img_000001.JPEG";
  const fs::path cut = t.path / "train" / "c0001_red_square" / "img_000004.JPEG";
  std::ofstream(junk, std::ios::trunc) << "not a jpeg at all";
  truncate_file(cut, 2.0 / 3);
  const ImageFolder folder = scan_image_folder(t.path / "train");
  for (DecodeBackend backend : {DecodeBackend::cpu, DecodeBackend::automatic}) {
    LoaderOptions lo;
    lo.batch = 4;
    lo.threads = 2;
    lo.seed = 1;
    lo.augment.size = 16;
    const GpuLoaderOptions go = same_batches_as(lo, backend);
    Loader cpu(folder, lo);
    GpuLoader gpu(folder, go);
    core::Stream stream;
    for (int b = 0; b < 6; ++b) {  // two epochs of 3 batches
      const Batch& want = cpu.next();
      const GpuBatch& got = gpu.next(stream);
      EXPECT_EQ(got.skipped, want.skipped) << gpu.decoder_name() << " batch " << b;
      std::vector<int32_t> labels(size_t(lo.batch));
      GPULAB_CHECK(cudaMemcpyAsync(labels.data(), got.labels, labels.size() * 4, cudaMemcpyDeviceToHost, stream));
      stream.synchronize();
      EXPECT_EQ(labels, want.labels) << gpu.decoder_name() << " batch " << b;
    }
    EXPECT_EQ(gpu.skipped_total(), cpu.skipped_total());
    EXPECT_GE(gpu.skipped_total(), 4);  // each corrupt file at least once per epoch
    EXPECT_EQ(gpu.corrupt_files(), (std::vector<std::string>{junk.string(), cut.string()}));
  }
}

TEST(GpuLoader, AllCorruptIsAnErrorNotAHang) {
  GPULAB_REQUIRE_GPU();
  TempDir t("gpu_loader_all_bad");
  fs::create_directories(t.path / "a");
  for (int i = 0; i < 3; ++i) std::ofstream(t.path / "a" / ("x" + std::to_string(i) + ".jpg")) << "nope";
  GpuLoaderOptions go;
  go.batch = 2;
  go.augment.size = 8;
  GpuLoader gpu(scan_image_folder(t.path), go);
  core::Stream stream;
  EXPECT_THROW(gpu.next(stream), core::InputError);
}

// A batch's images, then its labels, copied into `to` (bytes + label_bytes) on `stream`.
void copy_batch(const GpuBatch& batch, std::byte* to, size_t bytes, size_t label_bytes, cudaStream_t stream) {
  GPULAB_CHECK(cudaMemcpyAsync(to, batch.images, bytes, cudaMemcpyDeviceToHost, stream));
  GPULAB_CHECK(cudaMemcpyAsync(to + bytes, batch.labels, label_bytes, cudaMemcpyDeviceToHost, stream));
}

// Batches (images, then labels) copied out on `stream`; with `slow_consumer`, a 30 ms host stall
// sits before each copy on the stream, so a loader that did not wait for the consumer would
// overwrite the batch's images or labels first.
std::vector<std::vector<std::byte>> run_loader(const ImageFolder& folder, const GpuLoaderOptions& go, int batches,
                                               bool slow_consumer) {
  GpuLoader gpu(folder, go);
  core::Stream stream;
  const size_t bytes = size_t(go.batch) * go.augment.size * go.augment.size * 3 * core::dtype_size(go.augment.out);
  const size_t label_bytes = size_t(go.batch) * sizeof(int32_t);
  std::vector<std::vector<std::byte>> out;
  std::vector<core::PinnedBuffer<std::byte>> pinned;
  for (int b = 0; b < batches; ++b) {
    const GpuBatch& batch = gpu.next(stream);
    if (slow_consumer)
      GPULAB_CHECK(cudaLaunchHostFunc(
          stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }, nullptr));
    pinned.emplace_back(bytes + label_bytes);
    copy_batch(batch, pinned.back().get(), bytes, label_bytes, stream);
  }
  stream.synchronize();
  for (auto& p : pinned) out.emplace_back(p.get(), p.get() + bytes + label_bytes);
  return out;
}

TEST(GpuLoader, SameSeedSameBytesAndTheConsumerStreamIsRespected) {
  GPULAB_REQUIRE_GPU();
  TempDir t("gpu_loader_seed");
  make_dataset(t.path, dataset_options(3, 8, 320, 240));
  const ImageFolder folder = scan_image_folder(t.path / "train");
  GpuLoaderOptions go = loader_options(6, 2, 42, 64, core::DType::bf16);
  const auto a = run_loader(folder, go, 7, false);
  const auto b = run_loader(folder, go, 7, true);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i] == b[i]) << "batch " << i << " differs between runs";
  go.seed = 43;
  const auto c = run_loader(folder, go, 1, false);
  EXPECT_FALSE(a[0] == c[0]) << "another seed must give other crops";
}

// Files read into page-locked memory (nvJPEG's uploads then asynchronous DMA) or pageable
// (GPULAB_NVJPEG_PINNED=0): the same batches to the bit, corrupt files replaced alike, across
// epochs and every slot's reuse. A bitstream overwritten while its upload was queued would differ.
TEST(GpuLoader, PinnedAndPageableFilesGiveIdenticalBatches) {
  GPULAB_REQUIRE_GPU();
  TempDir t("gpu_loader_pinned");
  make_dataset(t.path, dataset_options(3, 10, 500, 375));
  std::ofstream(t.path / "train" / "c0000_red_circle" / "img_000003.JPEG", std::ios::trunc) << "not a jpeg";
  truncate_file(t.path / "train" / "c0002_red_triangle" / "img_000005.JPEG", 0.5);
  const ImageFolder folder = scan_image_folder(t.path / "train");
  const GpuLoaderOptions go = loader_options(8, 3, 77, 96, core::DType::bf16);
  setenv("GPULAB_NVJPEG_PINNED", "0", 1);
  EXPECT_NE(GpuLoader(folder, go).decoder_name().find("GPULAB_NVJPEG_PINNED=0"), std::string::npos);
  const auto pageable = run_loader(folder, go, 12, false);  // 4 epochs of 3 batches
  unsetenv("GPULAB_NVJPEG_PINNED");
  const GpuLoader probe(folder, go);
  std::cout << "decoder: " << probe.decoder_name() << "\n";
  EXPECT_EQ(probe.decoder_name().find("PINNED"), std::string::npos);
  const auto pinned = run_loader(folder, go, 12, true);
  ASSERT_EQ(pinned.size(), pageable.size());
  for (size_t i = 0; i < pinned.size(); ++i) EXPECT_TRUE(pinned[i] == pageable[i]) << "batch " << i << " differs";
}

TEST(GpuLoader, QuiescedLoaderLetsAnotherThreadCaptureAGraph) {
  // A Global-mode capture forbids every other thread's unsafe CUDA calls (cudaMalloc, stream and
  // event synchronizations): right after next() the loader thread builds the next batches (their
  // first decode areas are allocated then), so it would fail or break the capture unless
  // quiesce() had made it idle. After each capture it resumes and hands out the same batches as
  // a loader never paused.
  GPULAB_REQUIRE_GPU();
  TempDir t("gpu_loader_quiesce");
  make_dataset(t.path, dataset_options(3, 8, 160, 120));
  const ImageFolder folder = scan_image_folder(t.path / "train");
  const GpuLoaderOptions go = loader_options(4, 2, 5, 32, GpuLoaderOptions{}.augment.out);
  const auto want = run_loader(folder, go, 6, false);
  const size_t label_bytes = size_t(go.batch) * sizeof(int32_t);
  const size_t bytes = want[0].size() - label_bytes;  // as run_loader: images, then labels
  GpuLoader gpu(folder, go);
  core::Stream stream, side;
  core::DeviceBuffer<int> scratch(1);
  std::vector<std::vector<std::byte>> got;
  auto take = [&] {
    const GpuBatch& b = gpu.next(stream);
    got.emplace_back(bytes + label_bytes);
    copy_batch(b, got.back().data(), bytes, label_bytes, stream);
    stream.synchronize();
  };
  take();
  for (int round = 0; round < 2; ++round) {
    gpu.quiesce();
    GPULAB_CHECK(cudaStreamBeginCapture(side, cudaStreamCaptureModeGlobal));
    GPULAB_CHECK(cudaMemsetAsync(scratch.get(), 0, sizeof(int), side));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // time for a busy loader thread to call CUDA
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(side, &graph), cudaSuccess) << "round " << round << ": the loader broke the capture";
    if (graph) GPULAB_CHECK(cudaGraphDestroy(graph));
    take();
    take();
  }
  take();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << "batch " << i << " differs";
}

TEST(GpuLoader, GarbledScanDataNeverCrashes) {
  // Header and end marker intact, entropy-coded data overwritten: only a decoder can tell. The
  // TurboJPEG path skips it as the CPU loader does; nvJPEG may decode it to noise or reject it
  // (then TurboJPEG decides), but the batch always arrives.
  GPULAB_REQUIRE_GPU();
  TempDir t("gpu_loader_garbled");
  make_dataset(t.path, dataset_options(2, 6, 160, 120));
  const fs::path victim = t.path / "train" / "c0001_red_square" / "img_000002.JPEG";
  std::vector<uint8_t> bytes = read_file_bytes(victim);
  Rng rng(3);
  for (size_t i = bytes.size() / 2; i < bytes.size() * 3 / 4; ++i) bytes[i] = uint8_t(rng.next() % 0xFF);  // no 0xFF
  std::ofstream(victim, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(bytes.data()), long(bytes.size()));
  const ImageFolder folder = scan_image_folder(t.path / "train");
  for (DecodeBackend backend : {DecodeBackend::cpu, DecodeBackend::automatic}) {
    LoaderOptions lo;
    lo.batch = 6;
    lo.threads = 2;
    lo.augment.size = 16;
    const GpuLoaderOptions go = same_batches_as(lo, backend);
    Loader cpu(folder, lo);
    GpuLoader gpu(folder, go);
    core::Stream stream;
    int64_t cpu_skipped = 0;
    for (int b = 0; b < 4; ++b) {
      cpu_skipped += cpu.next().skipped;
      const GpuBatch& got = gpu.next(stream);
      stream.synchronize();  // ready in `stream`'s order: cudaMemcpy does not wait for a non-blocking stream
      for (float v : device_floats(got.images, size_t(lo.batch) * 16 * 16 * 3, core::DType::f32)) ASSERT_TRUE(std::isfinite(v));
    }
    const DecodeStats st = gpu.decode_stats();
    std::cout << gpu.decoder_name() << ": skipped " << gpu.skipped_total() << " (CPU loader " << cpu_skipped
              << "); decoded by hardware " << st.hardware << ", GPU hybrid " << st.gpu_hybrid << ", CPU " << st.cpu << "\n";
    if (backend == DecodeBackend::cpu) {
      EXPECT_EQ(gpu.skipped_total(), cpu_skipped);
    }
    EXPECT_GE(cpu_skipped, 1);
  }
}

TEST(GpuLoader, LoadRateOfBothPipelines) {
  // Not a benchmark (no bar): the gpu pipeline delivers every batch and reports its decoder.
  GPULAB_REQUIRE_GPU();
  TempDir t("gpu_load_rate");
  make_dataset(t.path, dataset_options(4, 32, 500, 375));
  LoadRateOptions opt;
  opt.batch = 32;
  opt.batches = 8;
  opt.threads = 4;
  for (const char* pipeline : {"cpu", "gpu"}) {
    opt.pipeline = pipeline;
    const LoadRate r = measure_load_rate(t.path, opt);
    std::cout << pipeline << " pipeline: " << r.images_per_second << " img/s " << r.decoder << "\n";
    EXPECT_EQ(r.images, 256);
    EXPECT_GT(r.images_per_second, 0);
    if (std::string(pipeline) == "gpu") {
      EXPECT_FALSE(r.decoder.empty());
      // The loader runs up to `prefetch` batches ahead of the last one taken.
      EXPECT_GE(r.decode.hardware + r.decode.gpu_hybrid + r.decode.cpu, int64_t(opt.batch) * (opt.batches + opt.warmup));
    }
  }
}
