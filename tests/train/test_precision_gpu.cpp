// Where does bf16's forward error come from? bf16 keeps 8 significant bits to fp16's 11, so with
// every rounding the same kind, its error should be about 8x fp16's. ResNetGpu.HalfPrecision-
// ForwardTracksFp32 saw ~17x (batch 4 at 32 px: layer4's BatchNorm normalizes 4 values per
// channel). This separates the suspects, each as the median over several batches:
//   eval forward (BN from running statistics: an affine map, no batch statistics): the convs,
//     the elementwise kernels and the conversions only;
//   train forward with cuDNN's general BN kernels for both dtypes (fp16 with deterministic=true
//     uses CUDNN_BATCHNORM_SPATIAL, as bf16 always does) against fp16's persistent kernels;
//   a small batch (4 x 32 px) against a larger one (32 x 64 px), where BN amplifies less.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "common/gpu.h"
#include "core/memory.h"
#include "train/resnet.h"

using namespace gpulab;
using namespace gpulab::train;

namespace {

struct Config {
  core::DType dtype;
  bool deterministic;
};

std::vector<float> logits_of(const ModelOptions& base, Config c, const std::vector<float>& x, bool training) {
  ModelOptions o = base;
  o.dtype = c.dtype;
  o.deterministic = c.deterministic;
  ResNet net(o);
  core::Stream s;
  std::vector<uint16_t> half(x.size());
  const void* src = x.data();
  if (c.dtype != core::DType::f32) {
    for (size_t i = 0; i < x.size(); ++i)
      half[i] = c.dtype == core::DType::f16 ? core::float_to_f16_bits(x[i]) : core::float_to_bf16_bits(x[i]);
    src = half.data();
  }
  core::DeviceBuffer<std::byte> images(x.size() * core::dtype_size(c.dtype));
  GPULAB_CHECK(cudaMemcpy(images.get(), src, images.bytes(), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaDeviceSynchronize());
  net.forward(images.get(), training, s);
  std::vector<float> z(size_t(o.batch) * o.net.classes);
  GPULAB_CHECK(cudaMemcpyAsync(z.data(), net.logits(), z.size() * 4, cudaMemcpyDeviceToHost, s));
  s.synchronize();
  return z;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    d += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    r += double(ref[i]) * ref[i];
  }
  return std::sqrt(d / r);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median relative L2 against fp32 over `batches` random batches, for fp16 (persistent BN),
// fp16 (general BN) and bf16 (general BN).
struct Errors {
  double f16, f16_general_bn, bf16;
};

Errors errors(int batch, int size, bool training, int batches) {
  ModelOptions o;
  o.net = {18, 10, 16, false};
  o.batch = batch;
  o.image_size = size;
  o.seed = 17;
  std::vector<double> e16, e16g, ebf;
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal;
  for (int b = 0; b < batches; ++b) {
    std::vector<float> x(size_t(batch) * size * size * 3);
    for (auto& v : x) v = normal(gen);
    const std::vector<float> ref = logits_of(o, {core::DType::f32, false}, x, training);
    e16.push_back(rel_l2(logits_of(o, {core::DType::f16, false}, x, training), ref));
    e16g.push_back(rel_l2(logits_of(o, {core::DType::f16, true}, x, training), ref));
    ebf.push_back(rel_l2(logits_of(o, {core::DType::bf16, false}, x, training), ref));
  }
  const Errors r{median(e16), median(e16g), median(ebf)};
  std::printf("%-5s batch %2d x %2d px: fp16 %.3g, fp16 general BN %.3g, bf16 %.3g; bf16/fp16 %.1f, bf16/fp16-general %.1f\n",
              training ? "train" : "eval", batch, size, r.f16, r.f16_general_bn, r.bf16, r.bf16 / r.f16,
              r.bf16 / r.f16_general_bn);
  return r;
}

}  // namespace

TEST(PrecisionGpu, BfloatErrorIsAboutEightTimesHalfs) {
  GPULAB_REQUIRE_GPU();
  const Errors eval_small = errors(4, 32, false, 7);
  const Errors eval_large = errors(32, 64, false, 5);
  const Errors train_small = errors(4, 32, true, 7);
  const Errors train_large = errors(32, 64, true, 5);
  // Without batch statistics every rounding is of one kind: 8x, give or take the spread of a median.
  for (const Errors& e : {eval_small, eval_large}) {
    EXPECT_GT(e.bf16 / e.f16, 4);
    EXPECT_LT(e.bf16 / e.f16, 14);
  }
  // With them, in the larger batch, the same; a bf16-only defect in cuDNN's general BN kernels
  // shows as a ratio far from 8 against fp16 through those same kernels.
  EXPECT_LT(train_large.bf16 / train_large.f16_general_bn, 14);
  EXPECT_LT(train_large.bf16 / train_large.f16, 14);
  (void)train_small;  // printed: the flaky test's regime
}
