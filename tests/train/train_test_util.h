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

// ResNet-18, 10 classes, 32 px, batch 8, 8 steps of SGD at 0.05 with 2 warmup steps. Under
// racecheck 4 steps: a step takes 15-20 s there (session 42), every kernel runs in the first ones
// and the later ones repeat them, and 2 untimed steps still leave 2 timed (or replayed) ones.
inline TrainOptions tiny_run() {
  TrainOptions o;
  o.depth = 18;
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
