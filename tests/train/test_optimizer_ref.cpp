// The CPU references of the optimizers, loss scaler and LR schedules against values worked out
// by hand from the papers' / PyTorch's / apex's formulas (worked numbers in the comments).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>

#include "train/loss_scale.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

using namespace gpulab::train;

namespace {
OptimizerConfig config(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.momentum = 0.9f;
  c.weight_decay = 0.01f;
  return c;
}
constexpr float kTol = 1e-6f;
}  // namespace

TEST(SgdRef, MomentumAndWeightDecayTwoSteps) {
  std::vector<RefTensor> t{{{1.f, -2.f}, {0.5f, 1.f}, {}, {}, true}, {{1.f}, {0.5f}, {}, {}, false}};
  const auto c = config(OptimizerKind::sgd);
  optimizer_step_ref(c, t, 0.1f, 1.f, 1);
  // g' = g + 0.01 p = [0.51, 0.98]; buf = g'; p -= 0.1 buf. No decay on the BN tensor: p = 1 - 0.05.
  EXPECT_NEAR(t[0].param[0], 0.949f, kTol);
  EXPECT_NEAR(t[0].param[1], -2.098f, kTol);
  EXPECT_NEAR(t[1].param[0], 0.95f, kTol);
  optimizer_step_ref(c, t, 0.1f, 1.f, 2);
  // g' = [0.5 + 0.00949, 1 - 0.02098]; buf = 0.9 [0.51, 0.98] + g' = [0.96849, 1.86102].
  EXPECT_NEAR(t[0].m[0], 0.96849f, kTol);
  EXPECT_NEAR(t[0].m[1], 1.86102f, kTol);
  EXPECT_NEAR(t[0].param[0], 0.852151f, kTol);
  EXPECT_NEAR(t[0].param[1], -2.284102f, kTol);
  // BN: buf = 0.9 * 0.5 + 0.5 = 0.95; p = 0.95 - 0.095.
  EXPECT_NEAR(t[1].param[0], 0.855f, kTol);
}

TEST(SgdRef, NesterovAndUnscaling) {
  auto c = config(OptimizerKind::sgd);
  c.nesterov = true;
  // The gradient arrives scaled by 1024 and is unscaled by inv_scale.
  std::vector<RefTensor> t{{{1.f}, {0.5f * 1024.f}, {}, {}, true}};
  optimizer_step_ref(c, t, 0.1f, 1.f / 1024.f, 1);
  // g' = 0.51, buf = 0.51, g = g' + 0.9 buf = 0.969; p = 1 - 0.0969.
  EXPECT_NEAR(t[0].param[0], 0.9031f, kTol);
  EXPECT_NEAR(t[0].m[0], 0.51f, kTol);
}

TEST(LarsRef, TrustRatioOnWeightsSkippedForBnAndBias) {
  auto c = config(OptimizerKind::lars);
  std::vector<RefTensor> t{{{3.f, 4.f}, {0.6f, 0.8f}, {}, {}, true}, {{2.f}, {0.5f}, {}, {}, false}};
  optimizer_step_ref(c, t, 0.5f, 1.f, 1);
  // |w| = 5, |g| = 1: trust = 0.001 * 5 / (1 + 0.01 * 5) = 0.0047619; scaled lr = 0.5 * trust.
  // g + wd w = [0.63, 0.84]; v = scaled_lr * that = [0.0015, 0.002]; w -= v.
  EXPECT_NEAR(t[0].m[0], 0.0015f, kTol);
  EXPECT_NEAR(t[0].m[1], 0.002f, kTol);
  EXPECT_NEAR(t[0].param[0], 2.9985f, kTol);
  EXPECT_NEAR(t[0].param[1], 3.998f, kTol);
  // BN/bias: plain lr, no decay: v = 0.5 * 0.5 = 0.25.
  EXPECT_NEAR(t[1].param[0], 1.75f, kTol);
  optimizer_step_ref(c, t, 0.5f, 1.f, 2);
  const double w_norm = std::sqrt(2.9985 * 2.9985 + 3.998 * 3.998);
  const double lr2 = 0.5 * 0.001 * w_norm / (1.0 + 0.01 * w_norm);
  const double v0 = 0.9 * 0.0015 + lr2 * (0.6 + 0.01 * 2.9985);
  EXPECT_NEAR(t[0].m[0], v0, kTol);
  EXPECT_NEAR(t[0].param[0], 2.9985 - v0, kTol);
  EXPECT_NEAR(t[1].param[0], 1.75f - (0.9f * 0.25f + 0.25f), kTol);
}

TEST(LarsRef, ZeroGradientKeepsTrustOne) {
  auto c = config(OptimizerKind::lars);
  std::vector<RefTensor> t{{{3.f, 4.f}, {0.f, 0.f}, {}, {}, true}};
  optimizer_step_ref(c, t, 0.5f, 1.f, 1);
  // trust 1: v = 0.5 * (0 + 0.01 w).
  EXPECT_NEAR(t[0].param[0], 3.f - 0.015f, kTol);
  EXPECT_NEAR(t[0].param[1], 4.f - 0.02f, kTol);
}

TEST(LambRef, FirstStepIsSignLikeWithTrustRatio) {
  auto c = config(OptimizerKind::lamb);
  std::vector<RefTensor> t{{{1.f, 2.f}, {0.3f, -0.4f}, {}, {}, true}, {{1.f}, {0.2f}, {}, {}, false}};
  optimizer_step_ref(c, t, 0.1f, 1.f, 1);
  // Global |g| = sqrt(0.09 + 0.16 + 0.04) < 1: no clipping. Step 1 bias correction makes
  // m_hat = g, v_hat = g^2, so u = g / (|g| + 1e-6) + wd p.
  const double u0 = 0.3 / 0.300001 + 0.01, u1 = -0.4 / 0.400001 + 0.02;
  const double ratio = 0.1 * std::sqrt(5.0) / std::sqrt(u0 * u0 + u1 * u1);
  EXPECT_NEAR(t[0].param[0], 1.0 - ratio * u0, 1e-6);
  EXPECT_NEAR(t[0].param[1], 2.0 - ratio * u1, 1e-6);
  EXPECT_NEAR(t[0].m[0], 0.03f, kTol);
  EXPECT_NEAR(t[0].v[1], 0.00016f, 1e-8);  // (1 - 0.999f) carries fp32 rounding
  // No decay: ratio = lr, u = 0.2 / 0.200001.
  EXPECT_NEAR(t[1].param[0], 1.0 - 0.1 * 0.2 / 0.200001, 1e-6);
}

TEST(LambRef, GlobalNormClippingAcrossTensors) {
  auto c = config(OptimizerKind::lamb);
  c.lamb_eps = 0.5f;  // large eps so the clipped gradient's size shows in the update
  c.weight_decay = 0.f;
  std::vector<RefTensor> t{{{1.f}, {3.f}, {}, {}, true}, {{1.f}, {-4.f}, {}, {}, true}};
  optimizer_step_ref(c, t, 0.1f, 1.f, 1);
  // Global norm 5 > 1: gradients divided by 5 -> 0.6 and -0.8; u = g / (|g| + 0.5); ratio = lr
  // (weight decay 0 means no trust ratio, as apex without nvlamb).
  EXPECT_NEAR(t[0].param[0], 1.0 - 0.1 * 0.6 / 1.1, 1e-6);
  EXPECT_NEAR(t[1].param[0], 1.0 + 0.1 * 0.8 / 1.3, 1e-6);
  // Step 2 uses bias corrections 1 - 0.9^2 and 1 - 0.999^2.
  t[0].grad = {0.f};
  t[1].grad = {0.f};
  const float m0 = t[0].m[0], v0 = t[0].v[0], p0 = t[0].param[0];
  optimizer_step_ref(c, t, 0.1f, 1.f, 2);
  const double m = 0.9 * m0, v = 0.999 * v0;
  const double u = (m / (1 - 0.81)) / (std::sqrt(v / (1 - 0.999 * 0.999)) + 0.5);
  EXPECT_NEAR(t[0].param[0], p0 - 0.1 * u, 1e-6);
}

TEST(LossScalerRef, GrowsAfterIntervalBacksOffOnInf) {
  LossScalerRef s;
  EXPECT_EQ(s.state().scale, 65536.f);
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.state().scale, 65536.f);
  EXPECT_EQ(s.state().growth_tracker, 1999);
  s.update(false);
  EXPECT_EQ(s.state().scale, 131072.f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  for (int i = 0; i < 5; ++i) s.update(false);
  s.update(true);
  EXPECT_EQ(s.state().scale, 65536.f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().skipped_steps, 1);
  s.update(true);
  EXPECT_EQ(s.state().scale, 32768.f);
  EXPECT_EQ(s.state().skipped_steps, 2);
}

TEST(LossScalerRef, GrowthThatOverflowsKeepsTheScale) {
  LossScalerRef s({FLT_MAX / 1.5f, 2.f, 0.5f, 3});
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.state().scale, FLT_MAX / 1.5f);
  EXPECT_EQ(s.state().growth_tracker, 0);
}

TEST(LrSchedule, WarmupCosinePolyStep) {
  LrSchedule s{ScheduleKind::cosine, 0.1, 0.0, 10, 110};
  EXPECT_NEAR(s.at(0), 0.01, 1e-12);
  EXPECT_NEAR(s.at(4), 0.05, 1e-12);
  EXPECT_NEAR(s.at(9), 0.1, 1e-12);
  EXPECT_NEAR(s.at(10), 0.1, 1e-12);
  EXPECT_NEAR(s.at(60), 0.05, 1e-12);
  EXPECT_NEAR(s.at(35), 0.05 * (1 + std::cos(M_PI / 4)), 1e-12);
  EXPECT_NEAR(s.at(110), 0.0, 1e-12);
  s.kind = ScheduleKind::polynomial;
  s.end = 0.0001;
  EXPECT_NEAR(s.at(60), 0.0001 + (0.1 - 0.0001) * 0.25, 1e-12);
  EXPECT_NEAR(s.at(200), 0.0001, 1e-12);  // clamped past the end
  s = {ScheduleKind::step, 0.1, 0.0, 0, 90, 2.0, 0.1, {30, 60, 80}};
  EXPECT_NEAR(s.at(29), 0.1, 1e-12);
  EXPECT_NEAR(s.at(30), 0.01, 1e-12);
  EXPECT_NEAR(s.at(60), 0.001, 1e-12);
  EXPECT_NEAR(s.at(89), 0.0001, 1e-12);
  EXPECT_THROW(schedule_from_name("linear"), gpulab::core::InputError);
  EXPECT_THROW(optimizer_from_name("adam"), gpulab::core::InputError);
}
