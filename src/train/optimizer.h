// Optimizers as fused multi-tensor CUDA kernels over fp32 master weights, each beside a CPU
// reference (optimizer_ref.cpp) with the same arithmetic:
//   sgd   torch.optim.SGD (momentum, dampening 0, optional Nesterov, L2 weight decay)
//   lars  the MLPerf ResNet reference LARS: trust ratio eta*|w| / (|g| + wd*|w| + eps), momentum on
//         the lr-scaled update; tensors without decay (BN, bias) skip both trust ratio and decay
//   lamb  apex FusedLAMB (adam_w_mode, bias correction, grad averaging, global grad-norm
//         clipping at max_grad_norm, trust ratio only where weight decay is non-zero)
// Gradients are unscaled by the loss scaler's device scale, and the whole step is skipped on the
// device when the scaler found inf/NaN: nothing waits for the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/memory.h"
#include "train/loss_scale.h"

namespace gpulab::train {

enum class OptimizerKind { sgd, lars, lamb };
OptimizerKind optimizer_from_name(const std::string& name);  // throws InputError

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::sgd;
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 1e-4f;  // applied to tensors with decay = true only
  float lars_eta = 0.001f;
  float lars_eps = 0.f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float lamb_eps = 1e-6f;
  float max_grad_norm = 1.f;  // lamb: clip the global gradient norm to this (<= 0: off)
};

// One parameter tensor: fp32 master weights and gradients; the optimizer owns its state.
// `copy`, when set, receives the updated weights in `copy_dtype` (the model's working copy).
struct ParamTensor {
  float* param = nullptr;
  float* grad = nullptr;
  int64_t count = 0;
  bool decay = true;  // false for BatchNorm scale/shift and biases
  void* copy = nullptr;
};

// Device-side step counter (LAMB's bias correction counts only steps that were taken).
struct OptimizerDeviceState {
  int32_t steps;
};

class Optimizer {
 public:
  Optimizer(OptimizerConfig cfg, std::vector<ParamTensor> params, core::DType copy_dtype = core::DType::f32);

  // One step at learning rate `lr`. `scaler` (device pointer, may be null): unscale by its scale,
  // skip when found_inf. For lamb the gradient buffers are overwritten with the update.
  void step(float lr, const LossScaleState* scaler, cudaStream_t stream);
  // The same with the rate read on the device from `lr` (one float): a captured CUDA graph
  // replays fixed arguments, so each replay's rate is uploaded there before it.
  void step(const float* lr, const LossScaleState* scaler, cudaStream_t stream);
  int32_t steps_taken(cudaStream_t stream) const;  // synchronizes

  // The whole state, for checkpoints: moment k (0: momentum / first moment, 1: lamb's second)
  // of every tensor packed in parameter order, and the step count. Both synchronize the stream.
  int moment_count() const { return cfg_.kind == OptimizerKind::lamb ? 2 : 1; }
  std::vector<float> read_moment(int k, cudaStream_t stream) const;
  void load_state(const std::vector<std::vector<float>>& moments, int32_t steps, cudaStream_t stream);

  const OptimizerConfig& config() const { return cfg_; }
  // The momentum / first-moment buffer of tensor i (second moment for `second`), for tests.
  const float* state(size_t i, bool second = false) const;

  struct TensorDesc {
    float* param;
    float* grad;
    float* m;
    float* v;
    void* copy;
    int64_t count;
    int32_t decay;
    int32_t first_chunk;
    int32_t num_chunks;
  };
  struct Chunk {
    int32_t tensor;
    int32_t index;  // elements [index * kChunk, min((index + 1) * kChunk, count))
  };
  static constexpr int64_t kChunk = 32768;
  // A step's learning rate as the kernels take it: `device` when set, else `value`.
  struct Lr {
    float value;
    const float* device;
  };

 private:
  void launch(Lr lr, const LossScaleState* scaler, cudaStream_t stream);

  OptimizerConfig cfg_;
  std::vector<ParamTensor> params_;
  core::DType copy_dtype_;
  std::vector<int64_t> state_offsets_;
  core::DeviceBuffer<float> moments_;  // m (and v for lamb) of every tensor, packed
  core::DeviceBuffer<TensorDesc> tensors_;
  core::DeviceBuffer<Chunk> chunks_;
  core::DeviceBuffer<float> partials_;  // per chunk: |w|^2, |g|^2, |u|^2
  core::DeviceBuffer<OptimizerDeviceState> device_state_;
  int num_chunks_ = 0;
};

// CPU reference: the same step on host copies. `inv_scale` multiplies the gradients; `step` is
// the 1-based count of steps taken (lamb's bias correction). m/v start as zeros of param's size.
struct RefTensor {
  std::vector<float> param, grad, m, v;
  bool decay = true;
};
void optimizer_step_ref(const OptimizerConfig& cfg, std::vector<RefTensor>& tensors, float lr, float inv_scale,
                        int step);

}  // namespace gpulab::train
