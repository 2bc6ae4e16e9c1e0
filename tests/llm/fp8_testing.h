// Shared by the fp8 CPU and GPU tests: an fp8 copy of the llama_tiny fixture (compressed-tensors
// / FBGEMM layout: every linear layer's weight as F8_E4M3 with `<name>_scale`, everything else as
// stored), and the comparison of fp8 logits with higher-precision ones.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/safetensors.h"
#include "kernels/fp8_quant.h"
#include "llm/fixtures.h"

namespace gpulab::llm::testing {

// How the scales of the written checkpoint look.
enum class Fp8ScaleLayout {
  per_channel,  // every scale [rows, 1] fp32: the engine's own quantization at load, bit for bit
  mixed,        // q_proj [] fp32 (per tensor), k_proj [1] fp32, v_proj [rows, 1] bf16, o_proj [rows] fp32, rest [rows, 1]
};

// A folder removed when the object goes.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() /
              ("gpulab_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++))) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path path_;
};

struct Fp8Tensor {
  std::vector<uint8_t> q;
  std::vector<float> row_scales;  // what the checkpoint means: value = row_scales[r] · e4m3
};

// Quantizes `name` of llama_tiny as written to the fp8 checkpoint under `layout`.
inline Fp8Tensor quantize_fixture_tensor(const std::vector<float>& w, int64_t rows, const std::string& name,
                                         Fp8ScaleLayout layout) {
  const int64_t cols = static_cast<int64_t>(w.size()) / rows;
  const bool per_tensor = layout == Fp8ScaleLayout::mixed &&
                          (name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos);
  Fp8Tensor t{std::vector<uint8_t>(w.size()), std::vector<float>(rows)};
  kernels::fp8_quantize_ref(t.q.data(), t.row_scales.data(), w.data(), rows, cols,
                            per_tensor ? kernels::Fp8Granularity::tensor : kernels::Fp8Granularity::row);
  if (layout == Fp8ScaleLayout::mixed && name.find("v_proj") != std::string::npos) {
    // Scales stored in bf16: requantize against the bf16-rounded scales the checkpoint holds
    // (1 % larger first, so rounding down cannot push the row's max past 448).
    for (int64_t r = 0; r < rows; ++r) {
      const float s = core::bf16_bits_to_float(core::float_to_bf16_bits(t.row_scales[r] * 1.01f));
      for (int64_t c = 0; c < cols; ++c) t.q[r * cols + c] = core::float_to_f8e4m3_bits(w[r * cols + c] / s, true);
      t.row_scales[r] = s;
    }
  }
  return t;
}

// Writes the fp8 checkpoint of llama_tiny into `dir` (config.json copied).
inline void write_fp8_fixture(const std::filesystem::path& dir, Fp8ScaleLayout layout) {
  const auto src = fixture_dir("llama_tiny");
  std::filesystem::copy_file(src / "config.json", dir / "config.json");
  const core::Checkpoint ckpt(src);
  std::vector<std::vector<uint8_t>> storage;  // keeps the bytes alive until written
  storage.reserve(3 * ckpt.tensors().size());
  std::vector<core::TensorToWrite> out;
  for (const auto& e : ckpt.tensors()) {
    const std::string& name = e.info->name;
    const auto bytes = ckpt.data(e);
    if (!is_linear_weight(name)) {
      out.push_back({name, e.info->dtype, e.info->shape, bytes});
      continue;
    }
    const int64_t rows = e.info->shape.at(0);
    std::vector<float> w(e.info->numel());
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(core::load_as_double(bytes.data(), e.info->dtype, i));
    Fp8Tensor t = quantize_fixture_tensor(w, rows, name, layout);
    storage.push_back(std::move(t.q));
    out.push_back({name, core::DType::f8e4m3, e.info->shape, storage.back()});
    const std::string scale = name + "_scale";
    const bool mixed = layout == Fp8ScaleLayout::mixed;
    std::vector<uint8_t> sb;
    auto put_f32 = [&](const std::vector<float>& v, std::vector<int64_t> shape) {
      sb.resize(v.size() * 4);
      std::memcpy(sb.data(), v.data(), sb.size());
      storage.push_back(std::move(sb));
      out.push_back({scale, core::DType::f32, std::move(shape), storage.back()});
    };
    if (mixed && name.find("q_proj") != std::string::npos) {
      put_f32({t.row_scales[0]}, {});
    } else if (mixed && name.find("k_proj") != std::string::npos) {
      put_f32({t.row_scales[0]}, {1});
    } else if (mixed && name.find("v_proj") != std::string::npos) {
      sb.resize(rows * 2);
      for (int64_t r = 0; r < rows; ++r) {
        const uint16_t b = core::float_to_bf16_bits(t.row_scales[r]);
        std::memcpy(sb.data() + 2 * r, &b, 2);
      }
      storage.push_back(std::move(sb));
      out.push_back({scale, core::DType::bf16, {rows, 1}, storage.back()});
    } else if (mixed && name.find("o_proj") != std::string::npos) {
      put_f32(t.row_scales, {rows});
    } else {
      put_f32(t.row_scales, {rows, 1});
    }
  }
  core::write_safetensors(dir / "model.safetensors", out);
}

// fp8 logits against reference logits [rows, vocab]. e4m3 keeps 3 mantissa bits, so the logits
// of a model move by several percent (a random-weight fixture like llama_tiny: ~6 % relative L2
// from the weights alone) and the top token flips wherever the reference's lead is within that
// noise. A flip is acceptable only at such an fp8 near tie: the reference's lead over the fp8
// pick at most 2^-3 of the top logit.
struct Fp8Agreement {
  double err2 = 0, ref2 = 0;  // sums of squares: error and reference
  int64_t rows = 0, agree = 0;
  int64_t decided = 0;        // positions whose reference lead exceeds the near-tie margin
  int64_t decided_agree = 0;  // ... where fp8 picks the same token
  float worst_flip = 0;       // the largest reference lead (relative to the top logit) fp8 flipped
  bool finite = true;

  double rel_l2() const { return std::sqrt(err2 / ref2); }
  void print(const char* what) const {
    std::printf("%s: rel L2 %.3e, top-1 %lld/%lld (%.1f%%), outside fp8 near ties %lld/%lld, largest lead flipped "
                "%.2e of the top logit\n",
                what, rel_l2(), (long long)agree, (long long)rows, 100.0 * agree / rows, (long long)decided_agree,
                (long long)decided, worst_flip);
  }
  void add(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
    for (size_t i = 0; i < want.size(); ++i) {
      finite = finite && std::isfinite(got[i]);
      err2 += double(got[i] - want[i]) * (got[i] - want[i]);
      ref2 += double(want[i]) * want[i];
    }
    for (size_t r = 0; r * vocab < want.size(); ++r) {
      const float* g = got.data() + r * vocab;
      const float* w = want.data() + r * vocab;
      const int64_t mine = std::max_element(g, g + vocab) - g, ref = std::max_element(w, w + vocab) - w;
      float second = -INFINITY;
      for (int64_t j = 0; j < vocab; ++j)
        if (j != ref) second = std::max(second, w[j]);
      ++rows;
      agree += mine == ref;
      if (w[ref] - second > std::ldexp(std::fabs(w[ref]), -3)) {
        ++decided;
        decided_agree += mine == ref;
      }
      if (mine != ref) worst_flip = std::max(worst_flip, (w[ref] - w[mine]) / std::fabs(w[ref]));
    }
  }
};

}  // namespace gpulab::llm::testing
