// `gpulab dataset`: write a synthetic ImageNet-layout JPEG folder, and scan one (classes, counts,
// corrupt files, CPU decode rate).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "data/jpeg.h"

namespace gpulab::data {

enum class SyntheticKind {
  shapes,  // class = shape x colour on a noisy background: learnable
  noise,   // uniform noise, labels carry no signal: for pipeline speed only
};

// The most classes `shapes` can tell apart (shapes x colours).
int max_shape_classes();

struct MakeOptions {
  int classes = 10;
  int train_images = 100;  // per class
  int val_images = 10;     // per class
  SyntheticKind kind = SyntheticKind::shapes;
  uint64_t seed = 0;
  int width = 500, height = 375;  // ImageNet's typical size
  int quality = 90;
  int threads = 1;
};

struct MakeReport {
  int64_t files = 0;
  int64_t bytes = 0;
};

// Called after each file as (files done, files in all), from worker threads, one call at a time.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// Writes DIR/train/<class>/*.JPEG and DIR/val/<class>/*.JPEG. The same options and seed give the
// same bytes. DIR must not exist or be empty (never mixes with an existing dataset).
MakeReport make_dataset(const std::filesystem::path& dir, const MakeOptions& opt, const ProgressFn& progress = {});

// The pixels of image `index` of class `label` (exposed for tests of learnability).
Image synthetic_image(const MakeOptions& opt, int label, uint64_t index);

struct SplitScan {
  std::string name;                 // "train", "val", or "." when DIR has no splits
  std::vector<std::string> classes;
  std::vector<int64_t> counts;      // images per class
  int64_t images = 0;
};

struct CorruptFile {
  std::string path;
  std::string problem;
};

struct ScanReport {
  std::string root;
  std::vector<SplitScan> splits;
  std::vector<CorruptFile> corrupt;  // sorted by path
  int64_t decoded = 0;               // images that decoded
  int64_t bytes = 0;                 // file bytes read
  double megapixels = 0;             // of the decoded images
  double seconds = 0;                // wall time of read + decode
  int threads = 1;
  double images_per_second() const { return seconds > 0 ? decoded / seconds : 0; }
};

// Decodes every JPEG of every split on `threads` threads.
ScanReport scan_dataset(const std::filesystem::path& dir, int threads, const ProgressFn& progress = {});

}  // namespace gpulab::data
