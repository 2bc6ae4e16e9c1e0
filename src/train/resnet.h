// ResNet-N v1.5 training on the GPU: NHWC activations in fp32, fp16 or bf16, convolutions and
// BatchNorm through cuDNN, the classifier in fp32 through cuBLASLt, softmax cross-entropy with
// label smoothing. Parameters are fp32 masters (packed, torchvision order); fp16/bf16 runs keep
// a working copy of the conv weights that the optimizer rewrites after each step.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"
#include "train/resnet_config.h"
#include "train/sync_batchnorm.h"

namespace gpulab::train {

// The layout in which one convolution direction (forward, backward-data, backward-filter) hands
// its operands to cuDNN. The model's tensors stay NHWC: an NCHW direction transposes its inputs
// into scratch buffers and its result back.
enum class ConvLayout { nhwc, nchw };

struct ModelOptions {
  ResNetConfig net;
  int batch = 256;
  int image_size = 224;
  core::DType dtype = core::DType::f32;              // activations and conv weights: f32, f16, bf16
  core::MathMode math = core::MathMode::strict_fp32;  // f32 only: tf32 lets cuDNN/cuBLAS use TF32
  uint64_t seed = 0;
  float label_smoothing = 0.1f;
  // Scratch a convolution algorithm may use (--conv-workspace). 4 GiB made tf32 and fp32 faster
  // on the H200 at batch 256 (tf32 2,968 -> 3,024 img/s, fp32 1,041 -> 1,058), but let NCHW pick
  // algorithms that failed the layout tests' accuracy (tf32 ResNet-50 gradients 0.71 from fp32
  // against NHWC's 0.19; fp32 ResNet-18 NCHW 4.3e-3 from NHWC against 1.2e-5), so it is not the default.
  size_t workspace_limit = size_t(512) << 20;
  // Only cuDNN algorithms that give the same bits every run (and deterministic max-pool
  // backward), so that a run, or a resumed run, repeats exactly.
  bool deterministic = false;
  // Every convolution direction in this layout; unset: for fp32 data (strict or tf32) NCHW where
  // that measured faster, its transposes included (cuDNN's strict-fp32 NHWC kernels are slow);
  // NHWC for fp16/bf16, with `deterministic` and under racecheck (nothing timed there).
  std::optional<ConvLayout> conv_layout;
  // Training folds each ReLU, and each block's residual add, into cuDNN's batch norm where cuDNN
  // offers that (fp16, not deterministic); false keeps separate ReLU and add kernels everywhere.
  bool fuse_bn_activation = true;
};

// One BatchNorm's running statistics: device fp32, `channels` each.
struct RunningStats {
  float* mean;
  float* var;
  int channels;
};

class ResNet {
 public:
  explicit ResNet(const ModelOptions& opt);
  ~ResNet();
  ResNet(const ResNet&) = delete;
  ResNet& operator=(const ResNet&) = delete;

  // images: device, batch x size x size x 3 in opt.dtype. training: batch statistics (and
  // running-stat updates) vs running statistics.
  void forward(const void* images, bool training, cudaStream_t stream);
  // Loss of the last forward against `labels` (device int32), then gradients of
  // loss * loss_weight * scaler->scale added into grads() (or written, when !accumulate).
  void backward(const int32_t* labels, float loss_weight, bool accumulate, const LossScaleState* scaler,
                cudaStream_t stream);

  // Loss and top-1 hits of the last forward, without gradients (evaluation).
  void score(const int32_t* labels, cudaStream_t stream);

  // After backward or score: mean loss and correct top-1 count over the first `rows` rows (all
  // when negative) of the batch (synchronizes the stream).
  float last_loss(cudaStream_t stream, int rows = -1) const;
  // Asynchronous: the last backward's (or score's) per-row losses, batch floats, into `host`
  // (pinned, so the copy never blocks); mean_loss then reduces them as last_loss does.
  void copy_row_losses(float* host, cudaStream_t stream) const;
  static float mean_loss(const float* row_losses, int batch, int rows = -1);
  int last_correct(cudaStream_t stream, int rows = -1) const;
  const float* logits() const;  // device, batch x classes, fp32 (after forward)

  float* params();  // fp32 masters, packed in resnet_params() order
  float* grads();
  int64_t param_count() const;
  const std::vector<ParamSpec>& param_specs() const;
  std::vector<ParamTensor> optimizer_params();  // with working-copy pointers where they exist
  std::vector<GradView> gradient_views() const;
  // Called on the host during backward as soon as the launches that finish parameter `param`'s
  // gradient (an index into param_specs()) are enqueued, in resnet_backward_order: data
  // parallelism starts reducing a bucket of gradients while the rest of backward runs.
  void set_gradient_ready_hook(std::function<void(int param)> hook);
  // Training BatchNorm over the batches of `world` ranks (train/sync_batchnorm.h) instead of
  // cuDNN's per-rank BatchNorm; `sum_over_ranks` sums statistics in place, in stream order.
  void set_batchnorm_sync(SumOverRanks sum_over_ranks, int world);
  // Rewrites the working copies from the masters (after editing params() directly).
  void sync_working_copy(cudaStream_t stream);
  // The BatchNorm of each conv, in ResNetLayout::convs order.
  std::vector<RunningStats> running_stats();
  // Training-mode forwards so far (torchvision's num_batches_tracked); settable for a resume.
  int64_t batches_tracked() const;
  void set_batches_tracked(int64_t n);
  const ModelOptions& options() const;
  // Whether training batch norm runs with the ReLU and residual add fused into cuDNN's calls
  // (ModelOptions::fuse_bn_activation, where cuDNN takes every layer; off after
  // set_batchnorm_sync).
  bool fused_bn_activation() const;
  // How many convolution directions (forward, backward-data, backward-filter of every layer) run
  // in NCHW (ModelOptions::conv_layout).
  int nchw_conv_directions() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpulab::train
