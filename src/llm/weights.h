// Where a model's weights come from: a Hugging Face checkpoint folder (validated against its
// config: every tensor present, with the right shape and a float dtype) or random values of the
// right shapes (`--dummy-weights`, for benchmarks).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "llm/config.h"

namespace gpulab::llm {

// A range of a tensor along one dimension: rows (dim 0) or columns (dim 1) of a 2-D tensor, or
// elements of a 1-D one (dim 0). count < 0: from begin to the end. The default is the whole.
struct TensorSlice {
  int dim = 0;
  int64_t begin = 0;
  int64_t count = -1;
};

// Where a slice lies in its whole (row-major) tensor: run i is `length` consecutive elements
// from element first + i · stride, and fills the slice from element i · length. A row range is
// one run, a column range one run per row.
struct SliceRuns {
  std::vector<int64_t> shape;  // of the slice
  int64_t runs = 1, length = 0, first = 0, stride = 0;

  int64_t numel() const { return runs * length; }
  template <class F>
  void for_each(F&& fn) const {  // fn(first element in the tensor, first in the slice, length)
    for (int64_t i = 0; i < runs; ++i) fn(first + i * stride, i * length, length);
  }
};

class WeightSource {
 public:
  // Reads `dir`/config.json (+ generation_config.json) and the safetensors in `dir`; throws
  // core::InputError naming the folder and the missing or wrong-shaped tensor.
  static WeightSource from_checkpoint(const std::filesystem::path& dir);
  // Random weights: linear layers ~ U(-a, a) with std 0.02, norms 1. Deterministic in `seed`.
  static WeightSource random(const LlamaConfig& config, uint64_t seed = 0);

  const LlamaConfig& config() const { return config_; }
  bool is_random() const { return !checkpoint_; }
  uint64_t seed() const { return seed_; }
  const WeightSpec& spec(const std::string& name) const;

  // Where `slice` of the named tensor lies; throws core::Error when it lies outside the tensor.
  SliceRuns slice_runs(const std::string& name, const TensorSlice& slice = {}) const;
  // `slice` of the named tensor (row-major, slice_runs(…).numel() elements) converted to
  // float32, or to bf16 bits. Read straight from the mapped file: only the slice is copied.
  // fp8 tensors come back dequantized (scale · value).
  std::vector<float> load_f32(const std::string& name, const TensorSlice& slice = {}) const;
  std::vector<uint16_t> load_bf16(const std::string& name, const TensorSlice& slice = {}) const;

  // fp8 checkpoints (compressed-tensors / FBGEMM style): a tensor stored as F8_E4M3 comes with
  // `<name>_scale` (fp32/bf16/fp16) holding one value (per tensor: shape [] or [1]) or one per
  // row (per output channel: [rows] or [rows, 1]); the real value is scale · e4m3.
  bool is_fp8(const std::string& name) const;
  std::span<const uint8_t> fp8_bytes(const std::string& name) const;  // the stored e4m3 bytes
  std::vector<float> fp8_row_scales(const std::string& name) const;   // one per row (a tensor scale repeated)

 private:
  LlamaConfig config_;
  std::vector<WeightSpec> specs_;
  std::shared_ptr<const core::Checkpoint> checkpoint_;
  uint64_t seed_ = 0;
};

// How random weights fill tensor `name`: value(i) = offset + scale * u(stream, i), u uniform in
// [-1, 1). Shared by the host loader and the device fill so both give the same model.
struct RandomFill {
  uint64_t stream;
  float scale;
  float offset;
};
RandomFill random_fill(const std::string& name, uint64_t seed);

#ifdef __CUDACC__
#define GPULAB_HOST_DEVICE __host__ __device__
#else
#define GPULAB_HOST_DEVICE
#endif
// splitmix64 of (stream, index), mapped to [-1, 1).
GPULAB_HOST_DEVICE inline float random_uniform(uint64_t stream, uint64_t index) {
  uint64_t z = stream + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}
GPULAB_HOST_DEVICE inline float random_value(const RandomFill& f, uint64_t index) {
  return f.offset + f.scale * random_uniform(f.stream, index);
}

}  // namespace gpulab::llm
