// CPU references of the optimizer steps in optimizer.cu: float arithmetic per element, norms
// accumulated in double.
#include <cmath>

#include "core/error.h"
#include "train/optimizer.h"

namespace gpulab::train {

namespace {

double sumsq(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * v;
  return s;
}

void sgd(const OptimizerConfig& c, RefTensor& t, float lr, float inv_scale) {
  const float wd = t.decay ? c.weight_decay : 0.f;
  for (size_t i = 0; i < t.param.size(); ++i) {
    float g = t.grad[i] * inv_scale + wd * t.param[i];
    if (c.momentum != 0.f) {
      const float b = c.momentum * t.m[i] + g;  // torch starts the buffer at g: the same, from zeros
      t.m[i] = b;
      g = c.nesterov ? g + c.momentum * b : b;
    }
    t.param[i] -= lr * g;
  }
}

void lars(const OptimizerConfig& c, RefTensor& t, float lr, float inv_scale) {
  float scaled_lr = lr, wd = 0.f;
  if (t.decay) {
    wd = c.weight_decay;
    const float w_norm = float(std::sqrt(sumsq(t.param)));
    const float g_norm = float(std::sqrt(sumsq(t.grad))) * inv_scale;
    const float trust = w_norm > 0 && g_norm > 0 ? c.lars_eta * w_norm / (g_norm + wd * w_norm + c.lars_eps) : 1.f;
    scaled_lr = lr * trust;
  }
  for (size_t i = 0; i < t.param.size(); ++i) {
    const float g = t.grad[i] * inv_scale + wd * t.param[i];
    const float v = c.momentum * t.m[i] + scaled_lr * g;
    t.m[i] = v;
    t.param[i] -= c.nesterov ? c.momentum * v + scaled_lr * g : v;
  }
}

void lamb(const OptimizerConfig& c, std::vector<RefTensor>& ts, float lr, float inv_scale, int step) {
  double g2 = 0;
  for (const auto& t : ts) g2 += sumsq(t.grad);
  const float global_norm = float(std::sqrt(g2)) * inv_scale;
  const float clip = c.max_grad_norm > 0 && global_norm > c.max_grad_norm ? global_norm / c.max_grad_norm : 1.f;
  const float bc1 = 1.f - std::pow(c.beta1, float(step)), bc2 = 1.f - std::pow(c.beta2, float(step));
  for (auto& t : ts) {
    const float wd = t.decay ? c.weight_decay : 0.f;
    std::vector<float> u(t.param.size());
    for (size_t i = 0; i < u.size(); ++i) {
      const float g = t.grad[i] * inv_scale / clip;
      t.m[i] = c.beta1 * t.m[i] + (1.f - c.beta1) * g;
      t.v[i] = c.beta2 * t.v[i] + (1.f - c.beta2) * g * g;
      u[i] = (t.m[i] / bc1) / (std::sqrt(t.v[i] / bc2) + c.lamb_eps) + wd * t.param[i];
    }
    const float p_norm = float(std::sqrt(sumsq(t.param))), u_norm = float(std::sqrt(sumsq(u)));
    const float ratio = wd != 0.f && p_norm != 0.f && u_norm != 0.f ? lr * p_norm / u_norm : lr;
    for (size_t i = 0; i < u.size(); ++i) t.param[i] -= ratio * u[i];
  }
}

}  // namespace

OptimizerKind optimizer_from_name(const std::string& name) {
  if (name == "sgd") return OptimizerKind::sgd;
  if (name == "lars") return OptimizerKind::lars;
  if (name == "lamb") return OptimizerKind::lamb;
  throw core::InputError("unknown optimizer '" + name + "' (sgd, lars or lamb)");
}

void optimizer_step_ref(const OptimizerConfig& cfg, std::vector<RefTensor>& tensors, float lr, float inv_scale,
                        int step) {
  for (auto& t : tensors) {
    t.m.resize(t.param.size(), 0.f);
    t.v.resize(t.param.size(), 0.f);
  }
  switch (cfg.kind) {
    case OptimizerKind::sgd:
      for (auto& t : tensors) sgd(cfg, t, lr, inv_scale);
      break;
    case OptimizerKind::lars:
      for (auto& t : tensors) lars(cfg, t, lr, inv_scale);
      break;
    case OptimizerKind::lamb:
      lamb(cfg, tensors, lr, inv_scale, step);
      break;
  }
}

}  // namespace gpulab::train
