// Dynamic loss scaling for fp16 training, exactly as torch.amp.GradScaler: start at 65536,
// double after 2000 consecutive clean steps, halve and skip the step when any gradient is
// inf/NaN. All state lives on the device, so a step never waits for the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace gpulab::train {

struct LossScaleConfig {
  float init_scale = 65536.f;
  float growth_factor = 2.f;
  float backoff_factor = 0.5f;
  int32_t growth_interval = 2000;
};

// Device-resident. Optimizer kernels read `scale` (to unscale) and `found_inf` (to skip).
struct LossScaleState {
  float scale;
  int32_t growth_tracker;  // clean steps since the last change
  int32_t found_inf;       // set by check_gradients, cleared by update
  int32_t skipped_steps;   // total, for reporting
};

// CPU reference of GradScaler.update() (torch._amp_update_scale_).
class LossScalerRef {
 public:
  explicit LossScalerRef(LossScaleConfig cfg = {}) : cfg_(cfg), state_{cfg.init_scale, 0, 0, 0} {}
  void update(bool found_inf);
  const LossScaleState& state() const { return state_; }

 private:
  LossScaleConfig cfg_;
  LossScaleState state_;
};

// One list of gradient buffers (fp32) to check for inf/NaN.
struct GradView {
  const float* data;
  int64_t count;
};

// Owns the device state and the launches; every call is asynchronous on `stream`.
class LossScaler {
 public:
  explicit LossScaler(LossScaleConfig cfg = {});
  ~LossScaler();
  LossScaler(const LossScaler&) = delete;
  LossScaler& operator=(const LossScaler&) = delete;

  // The gradient buffers check_gradients looks at (copied to the device once).
  void watch(const std::vector<GradView>& grads);
  // Sets found_inf when any element of any watched gradient is not finite.
  void check_gradients(cudaStream_t stream);
  // GradScaler.update(): grows, backs off or holds the scale; clears found_inf.
  void update(cudaStream_t stream);
  const LossScaleState* device_state() const { return state_; }
  LossScaleState read(cudaStream_t stream) const;  // synchronizes the stream
  // Asynchronous: the state as of this point of `stream` into `host` (pinned: the copy never blocks).
  void copy_state(LossScaleState* host, cudaStream_t stream) const;
  void load(const LossScaleState& state, cudaStream_t stream);  // a resumed run's; synchronizes

 private:
  LossScaleConfig cfg_;
  LossScaleState* state_ = nullptr;
  GradView* grads_ = nullptr;
  int grad_count_ = 0;
  int64_t longest_ = 0;
};

}  // namespace gpulab::train
