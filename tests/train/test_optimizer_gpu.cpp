// Fused optimizer kernels and the device loss scaler against their CPU references.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "common/gpu.h"
#include "core/dtype.h"
#include "core/memory.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"

using namespace gpulab;
using namespace gpulab::train;

namespace {

struct DeviceTensor {
  core::DeviceBuffer<float> param, grad;
  core::DeviceBuffer<uint16_t> copy;  // fp16 working copy
};

// Copies go on the optimizer's stream, which is non-blocking: a plain cudaMemcpy would neither
// wait for the step still running there nor be ordered before the next one.
std::vector<float> download(const float* d, size_t n, cudaStream_t s) {
  std::vector<float> h(n);
  GPULAB_CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  GPULAB_CHECK(cudaStreamSynchronize(s));
  return h;
}

void upload(float* d, const std::vector<float>& h, cudaStream_t s) {
  GPULAB_CHECK(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  GPULAB_CHECK(cudaStreamSynchronize(s));
}

// Sizes around the chunk (32768) and a non-decayed tensor, as BN parameters would be.
const std::vector<std::pair<int64_t, bool>> kShapes{
    {1, true}, {1000, true}, {32768, true}, {32769, true}, {100003, true}, {70000, false}, {64, false}};

struct Case {
  const char* name;
  OptimizerConfig cfg;
};

std::vector<Case> cases() {
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::sgd;
  OptimizerConfig nesterov = sgd;
  nesterov.nesterov = true;
  OptimizerConfig lars;
  lars.kind = OptimizerKind::lars;
  lars.weight_decay = 5e-5f;
  OptimizerConfig lamb;
  lamb.kind = OptimizerKind::lamb;
  lamb.weight_decay = 0.01f;
  OptimizerConfig lamb_clip = lamb;
  lamb_clip.max_grad_norm = 0.5f;  // the random gradients' global norm is far above: clipping active
  return {{"sgd", sgd}, {"sgd_nesterov", nesterov}, {"lars", lars}, {"lamb", lamb}, {"lamb_clip", lamb_clip}};
}

// atol(i): the absolute bar of element i.
template <class Atol>
void expect_close(const std::vector<float>& got, const std::vector<float>& want, Atol atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isfinite(got[i]) && std::abs(double(got[i]) - want[i]) <= atol(i) + rtol * std::abs(want[i]);
    if (!ok && bad++ < 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

// Compares the updates (param - initial) rather than the params, so a small LARS step
// (about 1e-5 of a weight of 0.1) is checked to 1e-4 of itself, not lost in the weight's size.
void expect_update_close(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<float>& initial, const std::string& what) {
  std::vector<float> got_delta(got.size()), want_delta(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    got_delta[i] = got[i] - initial[i];
    want_delta[i] = want[i] - initial[i];
  }
  // atol: a few fp32 ulps of the weight itself (each step rounds the new weight to its ulp, and
  // fma contraction may round differently from the host): 4 * 2^-23 * |w| is 4 to 8 ulps of w;
  // plus the same few ulps of the tensor's largest update, because the update is lr times a
  // moment whose fma-vs-host rounding is bounded by ulps of the largest moment (see
  // expect_moment_close), not of this element: a weight near zero otherwise gets a bar of 1e-11
  // against an honest 1e-8 (seen on the H200). rtol: norm summation order.
  double largest_update = 0;
  for (float d : want_delta) largest_update = std::max(largest_update, double(std::abs(d)));
  const auto atol = [&](size_t i) {
    return 4 * 0x1p-23 * (std::max(std::abs(double(initial[i])), std::abs(double(want[i]))) + largest_update);
  };
  expect_close(got_delta, want_delta, atol, 1e-4, what);
}

// Moments: nvcc contracts `beta * m + g` into one fma where the host rounds the product first, so
// each step may differ by half an fp32 ulp of the larger term. Where the sum cancels to near zero
// no relative bar covers that, hence an absolute floor of a few ulps of the tensor's largest moment.
void expect_moment_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  double largest = 0;
  for (float v : want) largest = std::max(largest, double(std::abs(v)));
  expect_close(got, want, [&](size_t) { return 1e-9 + 4 * 0x1p-23 * largest; }, 2e-5, what);
}

}  // namespace

TEST(OptimizerGpu, MatchesReferenceOverStepsWithLossScale) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 gen(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 1.f);
  core::Stream stream;
  const float scale = 1024.f;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    std::vector<DeviceTensor> dev;
    std::vector<RefTensor> ref;
    std::vector<ParamTensor> params;
    std::vector<std::vector<float>> initial;
    for (const auto& [n, decay] : kShapes) {
      DeviceTensor d{core::DeviceBuffer<float>(n), core::DeviceBuffer<float>(n), core::DeviceBuffer<uint16_t>(n)};
      RefTensor r;
      r.decay = decay;
      for (int64_t i = 0; i < n; ++i) r.param.push_back(0.1f * normal(gen));
      upload(d.param.get(), r.param, stream);
      GPULAB_CHECK(cudaMemsetAsync(d.copy.get(), 0xFF, d.copy.bytes(), stream));  // poison: NaN in fp16
      params.push_back({d.param.get(), d.grad.get(), n, decay, d.copy.get()});
      initial.push_back(r.param);
      dev.push_back(std::move(d));
      ref.push_back(std::move(r));
    }
    LossScaler scaler({scale, 2.f, 0.5f, 2000});
    Optimizer opt(c.cfg, params, core::DType::f16);
    for (int step = 1; step <= 3; ++step) {
      for (size_t t = 0; t < ref.size(); ++t) {
        std::vector<float> g(ref[t].param.size());
        for (auto& v : g) v = normal(gen) * scale;  // gradients as a scaled loss produces them
        ref[t].grad = g;
        upload(dev[t].grad.get(), g, stream);
      }
      const float lr = 0.05f * step;
      opt.step(lr, scaler.device_state(), stream);
      optimizer_step_ref(c.cfg, ref, lr, 1.f / scale, step);
    }
    EXPECT_EQ(opt.steps_taken(stream), 3);
    for (size_t t = 0; t < ref.size(); ++t) {
      SCOPED_TRACE("tensor " + std::to_string(t));
      // Norms are summed in a different order (fp32 tree vs double): a few ulps on the trust ratio.
      const auto p = download(dev[t].param.get(), ref[t].param.size(), stream);
      expect_update_close(p, ref[t].param, initial[t], "param");
      expect_moment_close(download(opt.state(t), ref[t].m.size(), stream), ref[t].m, "m");
      if (c.cfg.kind == OptimizerKind::lamb)
        expect_moment_close(download(opt.state(t, true), ref[t].v.size(), stream), ref[t].v, "v");
      std::vector<uint16_t> copy(p.size());
      GPULAB_CHECK(cudaMemcpyAsync(copy.data(), dev[t].copy.get(), copy.size() * 2, cudaMemcpyDeviceToHost, stream));
      GPULAB_CHECK(cudaStreamSynchronize(stream));
      for (size_t i = 0; i < p.size(); ++i)
        ASSERT_EQ(copy[i], core::float_to_f16_bits(p[i])) << "fp16 copy of element " << i;
    }
  }
}

TEST(OptimizerGpu, InfOrNanGradientSkipsTheStepOnDevice) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 gen(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 1.f);
  core::Stream stream;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const int64_t n = 50000;
    core::DeviceBuffer<float> param(n), grad(n);
    RefTensor r;
    for (int64_t i = 0; i < n; ++i) r.param.push_back(normal(gen));
    upload(param.get(), r.param, stream);
    LossScaler scaler({256.f, 2.f, 0.5f, 2000});
    scaler.watch({{grad.get(), n}});
    Optimizer opt(c.cfg, {{param.get(), grad.get(), n, true, nullptr}});
    std::vector<RefTensor> ref{r};
    float ref_scale = 256.f;
    int ref_steps = 0;
    std::vector<float> before = r.param;  // the device's weights before this step
    for (int step = 0; step < 4; ++step) {
      std::vector<float> g(n);
      for (auto& v : g) v = normal(gen) * ref_scale;
      const bool poison = step == 1 || step == 2;
      if (step == 1) g[n - 7] = INFINITY;
      if (step == 2) g[3] = NAN;
      upload(grad.get(), g, stream);
      scaler.check_gradients(stream);
      opt.step(0.1f, scaler.device_state(), stream);
      scaler.update(stream);
      if (!poison) {
        ref[0].grad = g;
        optimizer_step_ref(c.cfg, ref, 0.1f, 1.f / ref_scale, ++ref_steps);
      } else {
        ref_scale *= 0.5f;
      }
      const LossScaleState s = scaler.read(stream);
      EXPECT_EQ(s.scale, ref_scale) << "step " << step;
      EXPECT_EQ(s.found_inf, 0);
      const auto p = download(param.get(), n, stream);
      if (poison) {  // bit for bit the device's own weights (the reference differs by fma rounding)
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(p[i], before[i]) << "skipped step changed element " << i;
      } else {
        expect_update_close(p, ref[0].param, r.param, "param");
      }
      before = p;
    }
    EXPECT_EQ(opt.steps_taken(stream), 2);  // lamb's bias correction counted only the steps taken
    EXPECT_EQ(scaler.read(stream).skipped_steps, 2);
  }
}

TEST(LossScalerGpu, DeviceUpdateMatchesReferenceOverARandomRun) {
  GPULAB_REQUIRE_GPU();
  std::mt19937 gen(std::random_device{}());
  core::Stream stream;
  const LossScaleConfig cfg{65536.f, 2.f, 0.5f, 5};
  LossScaler dev(cfg);
  LossScalerRef ref(cfg);
  const int64_t n = 3000;
  core::DeviceBuffer<float> a(n), b(7);
  dev.watch({{a.get(), n}, {b.get(), 7}});
  std::vector<float> clean_a(n, 1.f), clean_b(7, -2.f);
  for (int step = 0; step < 300; ++step) {
    const bool inf = gen() % 7 == 0;
    std::vector<float> ha = clean_a, hb = clean_b;
    if (inf) (gen() % 2 ? ha[gen() % n] : hb[gen() % 7]) = gen() % 2 ? INFINITY : NAN;
    upload(a.get(), ha, stream);
    upload(b.get(), hb, stream);
    dev.check_gradients(stream);
    dev.update(stream);
    ref.update(inf);
    const LossScaleState s = dev.read(stream);
    ASSERT_EQ(s.scale, ref.state().scale) << "step " << step;
    ASSERT_EQ(s.growth_tracker, ref.state().growth_tracker) << "step " << step;
    ASSERT_EQ(s.skipped_steps, ref.state().skipped_steps) << "step " << step;
    ASSERT_EQ(s.found_inf, 0);
  }
}

TEST(OptimizerGpu, RateFromDeviceMemoryStepsAsTheHostRate) {
  // step(const float*) (CUDA graph replays) against step(float): the same bits, every optimizer,
  // over steps whose rate changes (a rate read once, or from the wrong place, would show).
  GPULAB_REQUIRE_GPU();
  std::mt19937 gen(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 1.f);
  core::Stream stream;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    std::vector<DeviceTensor> dev[2];
    std::vector<ParamTensor> params[2];
    std::vector<std::vector<float>> initial;
    for (const auto& [n, decay] : kShapes) {
      std::vector<float> p(static_cast<size_t>(n));
      for (auto& v : p) v = 0.1f * normal(gen);
      initial.push_back(p);
      for (int k = 0; k < 2; ++k) {
        DeviceTensor d{core::DeviceBuffer<float>(n), core::DeviceBuffer<float>(n), core::DeviceBuffer<uint16_t>(n)};
        upload(d.param.get(), p, stream);
        params[k].push_back({d.param.get(), d.grad.get(), n, decay, d.copy.get()});
        dev[k].push_back(std::move(d));
      }
    }
    Optimizer host_rate(c.cfg, params[0], core::DType::f16), device_rate(c.cfg, params[1], core::DType::f16);
    core::DeviceBuffer<float> lr(1);
    for (int step = 1; step <= 3; ++step) {
      for (size_t t = 0; t < initial.size(); ++t) {
        std::vector<float> g(initial[t].size());
        for (auto& v : g) v = normal(gen);
        upload(dev[0][t].grad.get(), g, stream);
        upload(dev[1][t].grad.get(), g, stream);
      }
      const float rate = 0.05f * float(step) + 0.013f;
      upload(lr.get(), {rate}, stream);
      host_rate.step(rate, nullptr, stream);
      device_rate.step(static_cast<const float*>(lr.get()), nullptr, stream);
    }
    for (size_t t = 0; t < initial.size(); ++t) {
      SCOPED_TRACE("tensor " + std::to_string(t));
      const size_t n = initial[t].size();
      const auto a = download(dev[0][t].param.get(), n, stream), b = download(dev[1][t].param.get(), n, stream);
      EXPECT_NE(a, initial[t]) << "no step was taken";
      EXPECT_EQ(std::memcmp(a.data(), b.data(), n * 4), 0) << "params differ";
      EXPECT_EQ(std::memcmp(download(host_rate.state(t), n, stream).data(), download(device_rate.state(t), n, stream).data(),
                            n * 4),
                0)
          << "moments differ";
    }
  }
}
