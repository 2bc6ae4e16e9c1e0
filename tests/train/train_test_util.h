// Shared by the train tests: a run small enough for a test, and a fresh temporary folder.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/sanitizer.h"
#include "train/trainer.h"

namespace gpulab::train::fixtures {

// The ResNet width of the training tests' runs: 64, and 16 under racecheck, which looks for races
// inside each kernel, and ours are the same kernels at any width, on fewer channels (the ResNet
// tests run at 8 and 16 everywhere). There a step at 64 took 76-98 s, mostly in cuDNN's
// instrumented kernels: six passes at widths 8 and 16 took 117 s, 9 s with cuDNN's kernels left
// out (session 44). At 16 a step took about 11-48 s with 2-4 runs sharing the GPU (session 46; the
// runs at 64 had others beside them too, so not a like-for-like timing).
inline int test_width() { return core::under_racecheck() ? 16 : 64; }

// ResNet-18 (test_width), 10 classes, 32 px, batch 8, 8 steps of SGD at 0.05 with 2 warmup
// steps. Under racecheck 4 steps: every kernel runs in the first ones and the later ones repeat
// them, and 2 untimed steps still leave 2 timed (or replayed) ones.
inline TrainOptions tiny_run() {
  TrainOptions o;
  o.depth = 18;
  o.width = test_width();
  o.classes = 10;
  o.image_size = 32;
  o.batch = 8;
  o.steps = core::under_racecheck() ? 4 : 8;
  o.warmup_steps_untimed = 2;
  o.schedule.base = 0.05;
  o.schedule.warmup = 2;
  return o;
}

// An empty folder in the temp directory, named after `tag` and the process.
inline std::filesystem::path temp_dir(const std::string& tag) {
  const auto d = std::filesystem::temp_directory_path() / ("gpulab_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A whole file's bytes (empty when it is missing): runs compared bit for bit.
inline std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace gpulab::train::fixtures
