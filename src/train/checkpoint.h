// ResNet weights and training state in safetensors, under torchvision's state_dict names:
//   conv1.weight [out][in][kh][kw] (OIHW, converted from our [out][kh][kw][in]), bn1.weight,
//   bn1.bias, bn1.running_mean, bn1.running_var, bn1.num_batches_tracked (int64), ...,
//   layer1.0.downsample.0.weight, ..., fc.weight [classes][features], fc.bias
// so `torch.load_state_dict(safetensors.torch.load_file(f))` takes an exported file, and
// `--init-from` takes torchvision's weights. A checkpoint is the same file plus the optimizer's
// moments ("optimizer.m.<param>", "optimizer.v.<param>", same layout as the parameter), the
// optimizer's step count, the loss scaler and the run's position and recipe (metadata), written
// through a temporary file and a rename: a crash or a full disk leaves the previous one intact.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"
#include "train/resnet.h"
#include "train/resnet_config.h"

namespace gpulab::train {

// Host copy of everything a model holds, in our layouts.
struct ModelState {
  std::vector<float> params;  // packed, resnet_params() order, conv weights [out][kh][kw][in]
  std::vector<float> running_mean, running_var;  // packed, one BN per conv in layout order
  int64_t batches_tracked = 0;
};

// Everything a resumed run needs to continue with the same bits.
struct TrainState {
  ModelState model;
  std::vector<std::vector<float>> moments;  // optimizer moments, each packed like params
  int32_t optimizer_steps = 0;
  std::optional<LossScaleState> scaler;  // fp16 runs only
  int64_t step = 0;                       // optimizer steps done; the loader resumes at step x accum
  std::map<std::string, std::string> recipe;  // the options that must match to resume
};

// Conv weights between our [out][kh][kw][in] and torchvision's [out][in][kh][kw].
std::vector<float> ohwi_to_oihw(const float* w, int out, int in, int k);
std::vector<float> oihw_to_ohwi(const float* w, int out, int in, int k);

// Writes the model under torchvision names (an export). Throws core::Error when the file
// cannot be written; the file at `path` is then as it was.
void write_torchvision(const std::filesystem::path& path, const ResNetLayout& layout, const ModelState& model);
// Reads torchvision-named weights for `layout` (names after `prefix`). Every parameter and running statistic must be
// there with its exact shape (num_batches_tracked may be absent); fp32, fp16 or bf16. Throws
// core::InputError naming the file and the first problem.
ModelState read_torchvision(const std::filesystem::path& path, const ResNetLayout& layout,
                            const std::string& prefix = "");
// One parameter-shaped array (gradients, moments) stored as `prefix` + each parameter's name,
// packed in our layout.
std::vector<float> read_param_tensors(const core::SafetensorsFile& file, const ResNetLayout& layout,
                                      const std::string& prefix);

// DIR/checkpoint.safetensors.
std::filesystem::path checkpoint_file(const std::filesystem::path& dir);
void write_checkpoint(const std::filesystem::path& dir, const ResNetLayout& layout, const TrainState& state);
// Throws core::InputError for a missing, truncated or foreign file, or one of another model.
TrainState read_checkpoint(const std::filesystem::path& dir, const ResNetLayout& layout, int moment_count);
// InputError naming the first option of `saved` that differs from `now`.
void check_same_recipe(const std::filesystem::path& dir, const std::map<std::string, std::string>& saved,
                       const std::map<std::string, std::string>& now);

// Between the GPU objects and the host state (each synchronizes `stream`).
ModelState download_model(ResNet& net, cudaStream_t stream);
void upload_model(ResNet& net, const ModelState& model, cudaStream_t stream);
TrainState capture_training(ResNet& net, const Optimizer& optimizer, const LossScaler* scaler, cudaStream_t stream);
void restore_training(const TrainState& state, ResNet& net, Optimizer& optimizer, LossScaler* scaler,
                      cudaStream_t stream);

}  // namespace gpulab::train
