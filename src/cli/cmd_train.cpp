// gpulab train: ResNet-N v1.5 training on synthetic data or an ImageNet-layout folder.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/table.h"
#include "core/progress.h"
#include "core/result.h"
#include "data/stall.h"
#include "train/trainer.h"

namespace gpulab::cli {

namespace {

struct TrainCli {
  train::TrainOptions opt;
  bool synthetic = false;
  std::string optimizer = "sgd";
  std::string schedule = "cosine";
  std::optional<float> weight_decay;
  std::string json_path;
  double bucket_mb = 25;
  std::string allreduce_dtype = "fp32";
  std::string conv_layout = "auto";
  double conv_workspace_mb = double(train::TrainOptions{}.conv_workspace_limit >> 20);
  double comm_timeout = 300;
  int64_t log_every = 0;  // steps between log lines on stdout; 0: the progress bar only
  std::optional<double> stall_timeout;  // else GPULAB_STALL_TIMEOUT or data::kStallTimeout
};

int run_train(TrainCli& c) {
  train::TrainOptions& o = c.opt;
  if (o.data.empty() && !c.synthetic) throw core::InputError("give --data DIR (ImageNet layout) or --synthetic");
  o.optimizer.kind = train::optimizer_from_name(c.optimizer);
  o.schedule.kind = train::schedule_from_name(c.schedule);
  o.parallel.bucket_bytes = int64_t(c.bucket_mb * (1 << 20));
  o.parallel.allreduce_dtype = train::allreduce_dtype_from_name(c.allreduce_dtype);
  o.parallel.timeout = std::chrono::milliseconds(int64_t(c.comm_timeout * 1000));
  if (c.conv_layout != "auto") o.conv_layout = c.conv_layout == "nchw" ? train::ConvLayout::nchw : train::ConvLayout::nhwc;
  o.conv_workspace_limit = size_t(c.conv_workspace_mb * (1 << 20));
  if (c.stall_timeout) data::set_stall_timeout(std::chrono::milliseconds(int64_t(*c.stall_timeout * 1000)));
  // Defaults of the usual recipes: torchvision SGD 1e-4, MLPerf LARS 5e-5, LAMB 0.01.
  o.optimizer.weight_decay = c.weight_decay.value_or(o.optimizer.kind == train::OptimizerKind::sgd    ? 1e-4f
                                                     : o.optimizer.kind == train::OptimizerKind::lars ? 5e-5f
                                                                                                     : 0.01f);
  if (o.schedule.kind == train::ScheduleKind::step && o.schedule.milestones.empty())
    o.schedule.milestones = {o.steps * 30 / 90, o.steps * 60 / 90, o.steps * 80 / 90};  // torchvision's epochs 30/60/80 of 90

  std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit must fail a checkpoint write (EFBIG), not kill the run
  std::unique_ptr<core::ProgressBar> bar;
  std::vector<float> loss_curve;  // per step, for the JSON (bench/compare_curves.py)
  const train::TrainReport r = train::run_training(o, [&](const train::StepReport& s) {
    loss_curve.push_back(s.loss);
    if (!bar) bar = std::make_unique<core::ProgressBar>("train", uint64_t(o.steps));
    char suffix[160];
    std::snprintf(suffix, sizeof suffix, "%.0f img/s  loss %.4f  lr %.4g%s", s.images_per_second, s.loss, s.lr,
                  o.precision == "fp16" ? ("  scale " + std::to_string(int64_t(s.loss_scale))).c_str() : "");
    bar->set_suffix(suffix);
    bar->set(uint64_t(s.step + 1));
    // std::endl flushes: a log file shows the line now, not when the buffer fills.
    if (c.log_every > 0 && ((s.step + 1) % c.log_every == 0 || s.step + 1 == o.steps))
      std::cout << "step " << s.step + 1 << "/" << o.steps << "  " << suffix << std::endl;
  });
  bar.reset();
  if (r.rank != 0) return 0;  // one report per job, from rank 0

  const std::string name = "resnet" + std::to_string(o.depth) + (o.width != 64 ? "w" + std::to_string(o.width) : "") +
                           "_" + o.precision + "_b" + std::to_string(o.batch) +
                           (r.world > 1 ? "_x" + std::to_string(r.world) : "") +
                           (o.data.empty() ? "_synthetic" : o.pipeline == "gpu" ? "_folder_gpu" : "_folder");
  std::cout << "ResNet-" << o.depth << " v1.5" << (o.width != 64 ? ", width " + std::to_string(o.width) : "") << ", "
            << human_count(uint64_t(r.params)) << " parameters, " << r.classes
            << " classes, " << o.precision << ", batch " << o.batch << " x " << o.accum << ", " << c.optimizer << ", "
            << o.steps << " steps on " << (o.data.empty() ? "synthetic data" : o.data)
            << (r.world > 1 ? ", data parallel over " + std::to_string(r.world) + " GPUs (batch per GPU)" : "") << "\n"
            << "throughput " << format_double(r.images_per_second, 1) << " img/s (" << r.timed_images << " images in "
            << format_double(r.timed_seconds, 2) << " s, after " << o.warmup_steps_untimed << " untimed steps)\n"
            << "loss " << format_double(r.first_loss, 4) << " -> " << format_double(r.last_loss, 4) << "\n";
  if (o.precision == "fp16") std::cout << "loss scaler skipped " << r.skipped_steps << " steps\n";
  if (r.val_images)
    std::cout << "validation: top-1 " << format_double(100 * r.val_top1, 2) << "% of " << r.val_images
              << " images, loss " << format_double(r.val_loss, 4) << "\n";
  if (!r.decoder.empty()) std::cout << "GPU pipeline, JPEG decode: " << r.decoder << "\n";
  if (r.graph_steps) std::cout << r.graph_steps << " steps replayed from CUDA graphs\n";
  if (r.start_step) std::cout << "resumed at step " << r.start_step << " from " << o.checkpoint_dir << "\n";
  if (r.checkpoints_written) std::cout << r.checkpoints_written << " checkpoints written to " << o.checkpoint_dir << "\n";
  if (!o.export_path.empty()) std::cout << "weights exported to " << o.export_path << " (torchvision names)\n";
  if (r.corrupt_skipped)
    std::cout << r.corrupt_skipped << " corrupt images skipped (" << r.corrupt_files.size() << " files)\n";

  if (!c.json_path.empty()) {
    core::ResultLog log(core::stamp_gpu(0));
    nlohmann::json params = {{"depth", o.depth}, {"width", o.width}, {"precision", o.precision}, {"batch", o.batch}, {"accum", o.accum},
                             {"optimizer", c.optimizer}, {"schedule", c.schedule}, {"lr", o.schedule.base},
                             {"steps", o.steps}, {"image_size", o.image_size}, {"classes", r.classes},
                             {"data", o.data.empty() ? "synthetic" : o.data}, {"pipeline", o.data.empty() ? "none" : o.pipeline},
                             {"decoder", r.decoder}, {"first_loss", r.first_loss},
                             {"last_loss", r.last_loss}, {"skipped_steps", r.skipped_steps},
                             {"corrupt_skipped", r.corrupt_skipped}, {"timed_images", r.timed_images},
                             {"timed_seconds", r.timed_seconds}, {"gpus", r.world},
                             {"untimed_steps", std::min<int64_t>(o.warmup_steps_untimed, o.steps - r.start_step - 1)},
                             {"deterministic", o.deterministic}, {"conv_layout", c.conv_layout}, {"conv_workspace_mb", c.conv_workspace_mb}, {"cuda_graph", o.cuda_graph}, {"graph_steps", r.graph_steps}, {"first_step", r.start_step},
                             {"loss_curve", loss_curve}};
    if (r.val_images) params["val"] = {{"images", r.val_images}, {"top1", r.val_top1}, {"loss", r.val_loss}};
    core::Result res{"train", name, "throughput", r.images_per_second, "img/s", std::nullopt, params};
    log.add(res);
    log.write(c.json_path);
  }
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, Runner& run) {
  auto c = std::make_shared<TrainCli>();
  auto& o = c->opt;
  auto* sub = app.add_subcommand("train", "ResNet-50 v1.5 training (synthetic or ImageNet folder)");
  auto* data = sub->add_option("--data", o.data, "ImageNet-layout folder (DIR/train/<class>/*.JPEG or DIR/<class>/*.JPEG)");
  sub->add_flag("--synthetic", c->synthetic, "A fixed random batch on the GPU: no input pipeline")->excludes(data);
  sub->add_option("--precision", o.precision, "fp32 (TF32 off), tf32, fp16 (dynamic loss scaling), bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "fp16", "bf16"}))
      ->capture_default_str();
  sub->add_option("--depth", o.depth, "ResNet depth")->check(CLI::IsMember({18, 34, 50, 101, 152}))->capture_default_str();
  sub->add_option("--width", o.width,
                  "Channels of the stem and first stage, doubling each stage: ResNet's 64, or a smaller multiple of 8 "
                  "for a quick run (its exports keep torchvision's names; only 64 loads into torchvision's model)")
      ->capture_default_str();
  sub->add_option("--classes", o.classes, "Classes for --synthetic")->capture_default_str();
  sub->add_option("--image-size", o.image_size, "Training crop size")->capture_default_str();
  sub->add_option("--batch", o.batch, "Images per micro-batch")->capture_default_str();
  sub->add_option("--accum", o.accum, "Micro-batches per optimizer step (gradient accumulation)")->capture_default_str();
  sub->add_option("--steps", o.steps, "Optimizer steps")->capture_default_str();
  sub->add_option("--optimizer", c->optimizer, "sgd, lars or lamb")->check(CLI::IsMember({"sgd", "lars", "lamb"}))->capture_default_str();
  sub->add_option("--lr", o.schedule.base, "Peak learning rate")->capture_default_str();
  sub->add_option("--lr-end", o.schedule.end, "Final learning rate (cosine, poly)")->capture_default_str();
  sub->add_option("--schedule", c->schedule, "cosine, poly or step (x0.1 at 30/60/80 of 90)")
      ->check(CLI::IsMember({"cosine", "poly", "step"}))
      ->capture_default_str();
  sub->add_option("--warmup", o.schedule.warmup, "Linear warmup steps")->capture_default_str();
  sub->add_option("--momentum", o.optimizer.momentum, "Momentum (sgd, lars)")->capture_default_str();
  sub->add_flag("--nesterov", o.optimizer.nesterov, "Nesterov momentum (sgd, lars)");
  sub->add_option("--weight-decay", c->weight_decay, "Weight decay, never on BN or bias (default: sgd 1e-4, lars 5e-5, lamb 0.01)");
  sub->add_option("--label-smoothing", o.label_smoothing, "Label smoothing")->capture_default_str();
  sub->add_option("--threads", o.loader_threads, "CPU decode/augment threads for --data")->capture_default_str();
  sub->add_option("--pipeline", o.pipeline,
                  "Input pipeline for --data: cpu (TurboJPEG + augmentation on --threads) or gpu (nvJPEG decode, "
                  "CUDA crop/resize/flip/normalize on its own stream)")
      ->check(CLI::IsMember({"cpu", "gpu"}))
      ->capture_default_str();
  sub->add_option("--seed", o.seed, "Seed for weights, data order and augmentation")->capture_default_str();
  sub->add_flag("--eval", o.eval, "After training, top-1 on DIR/val (eval transform: resize, center crop)");
  sub->add_option("--gpus", o.parallel.gpus, "Data parallel over N GPUs of this node, one thread each (--batch is per GPU); "
                  "under torchrun/mpirun/srun start one process per GPU instead")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--bucket-mb", c->bucket_mb, "Data parallel: MB of fp32 gradients per all-reduce bucket")
      ->check(CLI::Range(0.001, 65536.0))
      ->capture_default_str();
  sub->add_option("--allreduce-dtype", c->allreduce_dtype, "Data parallel: gradients on the wire in fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_flag("--sync-bn", o.parallel.sync_batchnorm,
                "Data parallel: BatchNorm over the global batch (statistics summed over GPUs every layer)");
  sub->add_option("--comm-timeout", c->comm_timeout,
                  "Data parallel: seconds before a missing, dead or hung rank ends the job with an error")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  sub->add_option("--stall-timeout", c->stall_timeout,
                  "Seconds without a batch from the input pipeline (a stuck decoder or GPU) before the run ends "
                  "with an error; 0 waits forever (default: GPULAB_STALL_TIMEOUT, else 300)")
      ->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--log-every", c->log_every,
                  "Also print a line (step, img/s, loss, lr) every N steps on stdout, for logs: the progress bar "
                  "shows only on a terminal")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--json", c->json_path, "Write the result (img/s, losses, settings) as JSON");
  auto* ckpt = sub->add_option("--checkpoint", o.checkpoint_dir,
                               "Write DIR/checkpoint.safetensors (weights, optimizer, loss scaler, position), atomically");
  sub->add_option("--checkpoint-every", o.checkpoint_every, "Checkpoint every K steps (default: each epoch with --data, else at the end)");
  auto* resume = sub->add_flag("--resume", o.resume, "Continue from the --checkpoint DIR (same options: bit-identical with --deterministic)")
                     ->needs(ckpt);
  sub->add_option("--init-from", o.init_from, "Start from torchvision-named weights (safetensors, e.g. an --export or a checkpoint)")
      ->excludes(resume);
  sub->add_option("--export", o.export_path, "After training, write the weights under torchvision names (safetensors)");
  sub->add_flag("--deterministic", o.deterministic, "Only deterministic cuDNN algorithms: runs repeat bit for bit");
  sub->add_option("--conv-layout", c->conv_layout,
                  "Layout cuDNN's convolutions run in (tensors stay NHWC; NCHW transposes each call's operands): "
                  "auto measures each direction of each fp32 layer (NHWC with fp16/bf16 or --deterministic)")
      ->check(CLI::IsMember({"auto", "nhwc", "nchw"}))
      ->capture_default_str();
  sub->add_option("--conv-workspace", c->conv_workspace_mb,
                  "MB of scratch a cuDNN convolution algorithm may use: faster algorithms that need more are "
                  "passed over")
      ->check(CLI::Range(1.0, 1048576.0))
      ->capture_default_str();
  sub->add_flag("--cuda-graph", o.cuda_graph,
                "Replay each step from CUDA graphs captured after the untimed steps (one GPU; same bits as without)");
  sub->footer("Examples:\n  gpulab train --synthetic --precision fp16 --batch 256 --steps 100\n"
              "  gpulab dataset make /tmp/shapes --classes 12 --images 200 && \\\n"
              "  gpulab train --data /tmp/shapes --depth 18 --image-size 64 --batch 64 --steps 300 --lr 0.2 --warmup 20 --eval\n"
              "  gpulab train --synthetic --precision fp16 --gpus 8 --batch 256\n"
              "  torchrun --nproc-per-node 8 --no-python gpulab train --synthetic --batch 256   (or mpirun, srun)");
  sub->callback([&run, c] { run = [c] { return run_train(*c); }; });
}

}  // namespace gpulab::cli
