// How fast an input pipeline alone delivers batches (no training): the ceiling it puts on
// `gpulab train --data`. `gpulab dataset load` prints it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/dtype.h"
#include "data/gpu_decode.h"

namespace gpulab::data {

struct LoadRateOptions {
  std::string pipeline = "gpu";  // "cpu" (Loader) or "gpu" (GpuLoader)
  DecodeBackend decode = DecodeBackend::automatic;  // gpu pipeline only
  int batch = 256;
  int batches = 40;  // timed, after `warmup` untimed ones
  int warmup = 3;
  int threads = 8;
  int size = 224;
  core::DType out = core::DType::f16;
  uint64_t seed = 0;
};

struct LoadRate {
  double images_per_second = 0;
  double seconds = 0;
  int64_t images = 0;
  int64_t corrupt_skipped = 0;
  std::string decoder;  // gpu pipeline: the BatchDecoder's name
  DecodeStats decode;   // gpu pipeline
  // gpu pipeline, per batch built: ms reading/checking files, ms in decode calls, ms in all.
  double read_ms = 0, decode_ms = 0, build_ms = 0;
};

// Times `batches` training batches of DIR (DIR/train when present). The gpu pipeline needs a device.
LoadRate measure_load_rate(const std::filesystem::path& dir, const LoadRateOptions& opt);

}  // namespace gpulab::data
