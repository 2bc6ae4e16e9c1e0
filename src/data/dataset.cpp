#include "data/dataset.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "core/error.h"
#include "core/safetensors.h"
#include "data/folder.h"
#include "data/parallel.h"
#include "data/rng.h"

namespace gpulab::data {

namespace fs = std::filesystem;

namespace {

struct Colour {
  const char* name;
  std::array<int, 3> rgb;
};
constexpr std::array<Colour, 8> kColours{{{"red", {220, 40, 40}},
                                          {"green", {40, 200, 60}},
                                          {"blue", {50, 80, 230}},
                                          {"yellow", {235, 220, 50}},
                                          {"magenta", {215, 50, 210}},
                                          {"cyan", {50, 215, 220}},
                                          {"orange", {240, 140, 30}},
                                          {"white", {245, 245, 245}}}};
constexpr std::array<const char*, 6> kShapes{"circle", "square", "triangle", "cross", "ring", "diamond"};

// Is (dx, dy), in units of the shape's radius, inside shape `s`?
bool inside(int s, double dx, double dy) {
  const double ax = std::abs(dx), ay = std::abs(dy), r2 = dx * dx + dy * dy;
  switch (s) {
    case 0: return r2 <= 1.0;
    case 1: return ax <= 0.8 && ay <= 0.8;
    case 2: return dy >= -1.0 && dy <= 0.8 && ax <= (dy + 1.0) * 0.5;  // apex up
    case 3: return (ax <= 0.3 && ay <= 1.0) || (ay <= 0.3 && ax <= 1.0);
    case 4: return r2 <= 1.0 && r2 >= 0.36;
    default: return ax + ay <= 1.0;
  }
}

std::string class_name(const MakeOptions& opt, int label) {
  char buf[64];
  if (opt.kind == SyntheticKind::noise) {
    std::snprintf(buf, sizeof buf, "c%04d", label);
  } else {
    const int s = label % int(kShapes.size()), c = label / int(kShapes.size());
    std::snprintf(buf, sizeof buf, "c%04d_%s_%s", label, kColours[c].name, kShapes[s]);
  }
  return buf;
}

// Serializes progress calls from worker threads.
class ProgressCounter {
 public:
  ProgressCounter(const ProgressFn& fn, int64_t total) : fn_(fn), total_(total) {}
  void tick() {
    if (!fn_) return;
    std::lock_guard lock(mutex_);
    fn_(++done_, total_);
  }

 private:
  const ProgressFn& fn_;
  int64_t total_, done_ = 0;
  std::mutex mutex_;
};

uint8_t clamp_u8(double v) { return static_cast<uint8_t>(std::clamp(std::lround(v), 0l, 255l)); }

}  // namespace

int max_shape_classes() { return int(kShapes.size() * kColours.size()); }

Image synthetic_image(const MakeOptions& opt, int label, uint64_t index) {
  Rng rng = Rng::for_item(opt.seed, uint64_t(label), index);
  Image img{opt.width, opt.height, std::vector<uint8_t>(size_t(opt.width) * opt.height * 3)};
  if (opt.kind == SyntheticKind::noise) {
    for (auto& v : img.rgb) v = static_cast<uint8_t>(rng.next() & 0xff);
    return img;
  }
  const int shape = label % int(kShapes.size());
  const auto& colour = kColours[label / int(kShapes.size())].rgb;
  // Dark grey background with noise; the shape's colour jitters a little per image.
  const double bg = rng.uniform(30, 90);
  std::array<double, 3> fg;
  for (int c = 0; c < 3; ++c) fg[c] = colour[c] + rng.uniform(-20, 20);
  const double side = std::min(opt.width, opt.height);
  const double radius = side * rng.uniform(0.18, 0.42);
  const double cx = rng.uniform(radius, opt.width - radius), cy = rng.uniform(radius, opt.height - radius);
  for (int y = 0; y < opt.height; ++y) {
    for (int x = 0; x < opt.width; ++x) {
      const bool in = inside(shape, (x + 0.5 - cx) / radius, (y + 0.5 - cy) / radius);
      const double noise = double(rng.next() % 25) - 12;
      uint8_t* px = &img.rgb[(size_t(y) * opt.width + x) * 3];
      for (int c = 0; c < 3; ++c) px[c] = clamp_u8((in ? fg[c] : bg) + noise);
    }
  }
  return img;
}

MakeReport make_dataset(const fs::path& dir, const MakeOptions& opt, const ProgressFn& progress) {
  if (opt.classes < 1) throw core::InputError("--classes must be at least 1");
  if (opt.train_images < 1 || opt.val_images < 0) throw core::InputError("--images must be at least 1 (and --val at least 0)");
  if (opt.kind == SyntheticKind::shapes && opt.classes > max_shape_classes())
    throw core::InputError("--kind shapes tells apart at most " + std::to_string(max_shape_classes()) +
                           " classes (6 shapes x 8 colours); ask for fewer or use --kind noise");
  if (opt.width < 16 || opt.height < 16) throw core::InputError("images must be at least 16x16");
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec))
    throw core::InputError(dir.string() + ": exists and is not empty; pick a new folder");

  struct Job {
    fs::path path;
    int label;
    uint64_t index;
  };
  std::vector<Job> jobs;
  for (const auto& [split, count] : {std::pair{"train", opt.train_images}, std::pair{"val", opt.val_images}}) {
    for (int c = 0; c < opt.classes && count > 0; ++c) {
      const fs::path folder = dir / split / class_name(opt, c);
      fs::create_directories(folder);
      // Val images come from indices after the train ones, so the two never repeat.
      const uint64_t first = split == std::string("train") ? 0 : uint64_t(opt.train_images);
      for (int i = 0; i < count; ++i) {
        char name[32];
        std::snprintf(name, sizeof name, "img_%06d.JPEG", i);
        jobs.push_back({folder / name, c, first + i});
      }
    }
  }
  std::atomic<int64_t> bytes{0};
  ProgressCounter counter(progress, int64_t(jobs.size()));
  parallel_for(int64_t(jobs.size()), opt.threads, [&](int64_t j) {
    const auto jpeg = encode_jpeg(synthetic_image(opt, jobs[j].label, jobs[j].index), opt.quality);
    core::write_file_atomic(jobs[j].path, std::span<const uint8_t>(jpeg));
    bytes += int64_t(jpeg.size());
    counter.tick();
  });
  return {int64_t(jobs.size()), bytes.load()};
}

ScanReport scan_dataset(const fs::path& dir, int threads, const ProgressFn& progress) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw core::InputError(dir.string() + ": not a folder");
  ScanReport report;
  report.root = dir.string();
  report.threads = std::max(threads, 1);
  std::vector<std::pair<std::string, fs::path>> splits;
  for (const char* name : {"train", "val"})
    if (fs::is_directory(dir / name, ec)) splits.emplace_back(name, dir / name);
  if (splits.empty()) splits.emplace_back(".", dir);

  std::vector<fs::path> files;
  for (const auto& [name, path] : splits) {
    const ImageFolder folder = scan_image_folder(path);
    SplitScan s{name, folder.classes, std::vector<int64_t>(folder.classes.size(), 0), int64_t(folder.samples.size())};
    for (const auto& sample : folder.samples) {
      ++s.counts[sample.label];
      files.push_back(sample.path);
    }
    report.splits.push_back(std::move(s));
  }

  std::mutex mutex;
  std::atomic<int64_t> decoded{0}, bytes{0};
  std::atomic<uint64_t> pixels{0};
  ProgressCounter counter(progress, int64_t(files.size()));
  const auto start = std::chrono::steady_clock::now();
  parallel_for(int64_t(files.size()), report.threads, [&](int64_t i) {
    const auto data = read_file_bytes(files[i]);
    bytes += int64_t(data.size());
    try {
      const Image img = decode_jpeg(data, files[i].string());
      pixels += uint64_t(img.width) * img.height;
      ++decoded;
    } catch (const CorruptImageError& e) {
      std::lock_guard lock(mutex);
      report.corrupt.push_back({files[i].string(), e.what()});
    }
    counter.tick();
  });
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.decoded = decoded;
  report.bytes = bytes;
  report.megapixels = double(pixels.load()) * 1e-6;
  std::sort(report.corrupt.begin(), report.corrupt.end(),
            [](const CorruptFile& a, const CorruptFile& b) { return a.path < b.path; });
  return report;
}

}  // namespace gpulab::data
