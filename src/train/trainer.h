// The training loop of `gpulab train`: data (synthetic or an ImageNet-layout folder through the
// CPU loader), the ResNet, optimizer, LR schedule and loss scaler, timed and reported.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "train/data_parallel.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/resnet.h"

namespace gpulab::train {

struct TrainOptions {
  std::string data;        // ImageNet-layout folder; empty: synthetic
  std::string precision = "fp32";  // fp32 (TF32 off), tf32, fp16 (dynamic loss scaling), bf16
  int depth = 50;
  int width = 64;          // channels of the stem and first stage: ResNet's 64, or fewer for quick runs
  int classes = 1000;      // synthetic only; a folder gives its own
  int image_size = 224;
  int batch = 256;         // per micro-batch
  int accum = 1;           // micro-batches per optimizer step
  int64_t steps = 100;
  OptimizerConfig optimizer;
  LrSchedule schedule;     // total is set to `steps`
  float label_smoothing = 0.1f;
  int loader_threads = 8;
  std::string pipeline = "cpu";  // folder data: "cpu" (Loader) or "gpu" (GpuLoader: nvJPEG + CUDA augmentation)
  uint64_t seed = 0;
  int warmup_steps_untimed = 5;  // left out of the throughput figure
  bool eval = false;  // top-1 on DIR/val after training (folder data only)
  // Checkpoints and interchange (checkpoint.h).
  std::string init_from;         // torchvision-named safetensors to start from
  std::string checkpoint_dir;    // writes DIR/checkpoint.safetensors
  int64_t checkpoint_every = 0;  // steps; 0: each epoch with `data`, otherwise at the end only
  bool resume = false;           // continue from checkpoint_dir's checkpoint
  std::string export_path;       // the final weights under torchvision names
  // Only deterministic cuDNN algorithms: a run, and a resumed run, repeat bit for bit.
  bool deterministic = false;
  std::optional<ConvLayout> conv_layout;  // ModelOptions::conv_layout
  size_t conv_workspace_limit = ModelOptions{}.workspace_limit;  // per convolution algorithm
  DataParallelOptions parallel;  // --gpus N, or the ranks of a torchrun/mpirun/srun job
  // Steps the host may issue beyond the last one reported (whose loss it has read), so the GPU
  // never idles waiting for the host at a step boundary. 0: each step is read back before the
  // next is issued (the old, synchronous loop; tests compare the two). Data parallel runs are
  // synchronous whatever this says: every rank averages each step's loss on the host.
  int report_lag = 2;
  // Replays each step from CUDA graphs captured after the untimed steps (single GPU only).
  bool cuda_graph = false;
};

struct StepReport {
  int64_t step = 0;
  float loss = 0;  // of the last micro-batch (data parallel: its mean over ranks)
  double lr = 0;
  float loss_scale = 1;
  double images_per_second = 0;  // since the timed part began
};

struct TrainReport {
  double images_per_second = 0;
  int64_t timed_images = 0;
  double timed_seconds = 0;
  float first_loss = 0, last_loss = 0;
  int32_t skipped_steps = 0;  // inf/NaN steps skipped by the loss scaler
  int64_t start_step = 0;  // > 0 when resumed
  int64_t checkpoints_written = 0;
  int64_t graph_steps = 0;  // --cuda-graph: steps replayed from the captured graphs
  int64_t corrupt_skipped = 0;
  std::vector<std::string> corrupt_files;
  std::string decoder;  // the GPU pipeline's JPEG decoder; empty otherwise
  int64_t params = 0;
  int classes = 0;
  int64_t val_images = 0;  // 0: no evaluation ran
  double val_top1 = 0;
  double val_loss = 0;
  int rank = 0, world = 1;  // data parallel: whose report this is (losses are means over ranks)
};

// Throws InputError for bad options, NoDeviceError without a GPU. Data parallel: on_step is
// called on rank 0 only; the report is that of the lowest rank this process ran.
TrainReport run_training(const TrainOptions& opt, const std::function<void(const StepReport&)>& on_step = {});

}  // namespace gpulab::train
