#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include <nvtx3/nvToolsExt.h>

#include "core/captured_graph.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/sanitizer.h"
#include "data/folder.h"
#include "data/gpu_loader.h"
#include "data/loader.h"
#include "data/stall.h"
#include "data/rng.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"

namespace gpulab::train {

namespace {

struct Precision {
  core::DType dtype;
  core::MathMode math;
  bool loss_scaling;
};

Precision precision_from_name(const std::string& p) {
  if (p == "fp32") return {core::DType::f32, core::MathMode::strict_fp32, false};
  if (p == "tf32") return {core::DType::f32, core::MathMode::tf32, false};
  if (p == "fp16") return {core::DType::f16, core::MathMode::strict_fp32, true};
  if (p == "bf16") return {core::DType::bf16, core::MathMode::strict_fp32, false};
  throw core::InputError("unknown precision '" + p + "' (fp32, tf32, fp16 or bf16)");
}

// A fixed random batch in the model's dtype: the GPU's speed without any input pipeline.
void fill_synthetic(const ModelOptions& m, void* images, int32_t* labels, uint64_t seed) {
  const size_t n = size_t(m.batch) * m.image_size * m.image_size * 3;
  data::Rng rng(seed);
  std::vector<uint16_t> half(n);
  std::vector<float> full(m.dtype == core::DType::f32 ? n : 0);
  for (size_t i = 0; i < n; ++i) {
    const float v = float(rng.uniform(-2.0, 2.0));
    if (m.dtype == core::DType::f32) full[i] = v;
    else half[i] = m.dtype == core::DType::f16 ? core::float_to_f16_bits(v) : core::float_to_bf16_bits(v);
  }
  GPULAB_CHECK(cudaMemcpy(images, m.dtype == core::DType::f32 ? static_cast<const void*>(full.data()) : half.data(),
                          n * core::dtype_size(m.dtype), cudaMemcpyHostToDevice));
  std::vector<int32_t> l(size_t(m.batch));
  for (auto& v : l) v = int32_t(rng.randint(0, m.net.classes));
  GPULAB_CHECK(cudaMemcpy(labels, l.data(), l.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  // Pageable uploads may return before their DMA lands, on the legacy stream that the training
  // stream (non-blocking) does not wait for.
  GPULAB_CHECK(cudaDeviceSynchronize());
}

// Top-1 and loss on DIR/val with the eval transform, every image once.
void evaluate(const TrainOptions& opt, core::DType dtype, ResNet& net, void* images, int32_t* labels,
              cudaStream_t stream, TrainReport& report) {
  const std::filesystem::path val = std::filesystem::path(opt.data) / "val";
  data::ImageFolder folder = data::scan_image_folder(val);
  if (int(folder.classes.size()) != report.classes)
    throw core::InputError(val.string() + ": " + std::to_string(folder.classes.size()) + " classes, but train has " +
                           std::to_string(report.classes));
  const int64_t n = int64_t(folder.samples.size());
  data::LoaderOptions lo;
  lo.batch = opt.batch;
  lo.threads = opt.loader_threads;
  lo.train = false;
  lo.augment.size = opt.image_size;
  lo.augment.out = dtype;
  data::Loader loader(std::move(folder), lo);
  const size_t image_bytes = size_t(opt.batch) * opt.image_size * opt.image_size * 3 * core::dtype_size(dtype);
  int64_t correct = 0;
  double loss_sum = 0;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    const data::Batch& batch = loader.next();
    GPULAB_CHECK(cudaMemcpyAsync(images, batch.images.data(), image_bytes, cudaMemcpyHostToDevice, stream));
    GPULAB_CHECK(cudaMemcpyAsync(labels, batch.labels.data(), batch.labels.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream));
    net.forward(images, false, stream);
    net.score(labels, stream);
    const int rows = int(std::min<int64_t>(opt.batch, n - b * opt.batch));  // the rest wrapped around
    correct += net.last_correct(stream, rows);
    loss_sum += double(net.last_loss(stream, rows)) * rows;
  }
  report.val_images = n;
  report.val_top1 = double(correct) / double(n);
  report.val_loss = loss_sum / double(n);
}

// One step's figures on their way to the host: copied into pinned memory behind the step's
// work, read once `done` has completed.
struct StepFigures {
  core::PinnedBuffer<float> row_loss;  // per row of every micro-batch of the step
  core::PinnedBuffer<LossScaleState> scale{1};
  core::PinnedBuffer<float> lr{1};  // --cuda-graph: the step's rate, uploaded before its replay
  core::Event done{cudaEventDisableTiming};
  StepReport report;  // step and lr, known when the step is issued
};

constexpr const char* kOptimizerNames[] = {"sgd", "lars", "lamb"};  // OptimizerKind order
constexpr const char* kScheduleNames[] = {"cosine", "poly", "step"};  // ScheduleKind order

// The options a checkpoint's bits depend on; a resume must repeat them.
std::map<std::string, std::string> recipe(const TrainOptions& o, int classes, int64_t images) {
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", v);
    return std::string(b);
  };
  const OptimizerConfig& c = o.optimizer;
  const LrSchedule& s = o.schedule;
  std::string milestones;
  for (int64_t m : s.milestones) milestones += std::to_string(m) + " ";
  return {{"depth", std::to_string(o.depth)}, {"classes", std::to_string(classes)},
          {"image_size", std::to_string(o.image_size)}, {"precision", o.precision}, {"batch", std::to_string(o.batch)},
          {"accum", std::to_string(o.accum)}, {"steps", std::to_string(o.steps)}, {"seed", std::to_string(o.seed)},
          {"label_smoothing", num(o.label_smoothing)}, {"deterministic", o.deterministic ? "yes" : "no"},
          {"data", images ? std::to_string(images) + " images" : "synthetic"},
          {"optimizer", std::string(kOptimizerNames[int(c.kind)]) + " momentum " + num(c.momentum) + (c.nesterov ? " nesterov" : "") +
                            " wd " + num(c.weight_decay) + " eta " + num(c.lars_eta) + " eps " + num(c.lars_eps) +
                            " betas " + num(c.beta1) + " " + num(c.beta2) + " " + num(c.lamb_eps) + " clip " +
                            num(c.max_grad_norm)},
          {"schedule", std::string(kScheduleNames[int(s.kind)]) + " lr " + num(s.base) + " end " + num(s.end) + " warmup " +
                           std::to_string(s.warmup) + " power " + num(s.power) + " gamma " + num(s.gamma) +
                           " milestones " + milestones}};
}

// One rank's training; dp is null for a plain single-GPU run.
TrainReport train_rank(const TrainOptions& opt, DataParallel* dp, const std::function<void(const StepReport&)>& on_step) {
  const Precision prec = precision_from_name(opt.precision);
  if (opt.batch < 1 || opt.accum < 1 || opt.steps < 1) throw core::InputError("--batch, --accum and --steps must be positive");

  if (opt.eval && (opt.data.empty() || !std::filesystem::is_directory(std::filesystem::path(opt.data) / "val")))
    throw core::InputError("--eval needs --data DIR with a DIR/val/<class>/*.JPEG folder");
  if (opt.resume && opt.checkpoint_dir.empty()) throw core::InputError("--resume needs --checkpoint DIR");
  if (opt.resume && !opt.init_from.empty()) throw core::InputError("--resume and --init-from exclude each other");
  if (opt.pipeline != "cpu" && opt.pipeline != "gpu") throw core::InputError("--pipeline must be cpu or gpu");
  if (opt.cuda_graph && dp)
    throw core::InputError("--cuda-graph is for single-GPU runs: leave it out with --gpus, or under torchrun/mpirun/srun");
  std::optional<data::ImageFolder> folder;
  std::optional<data::ImageFolder> gpu_folder;  // the GPU loader is made once the device is known
  int classes = opt.classes;
  if (!opt.data.empty()) {
    folder = data::scan_image_folder(data::train_split(opt.data));
    classes = int(folder->classes.size());
  }
  // Checkpoints are read before anything starts on the GPU: a bad file is an input error.
  const ResNetConfig net_config{opt.depth, classes, opt.width, false};
  const ResNetLayout layout = resnet_layout(net_config);
  check_gpu_width(opt.width);  // the ResNet checks it too, but after the device is looked for
  if (!opt.resume && !opt.checkpoint_dir.empty() && std::filesystem::exists(checkpoint_file(opt.checkpoint_dir)))
    throw core::InputError(checkpoint_file(opt.checkpoint_dir).string() +
                           " exists: add --resume to continue that run, or choose another --checkpoint folder");
  std::optional<TrainState> resumed;
  if (opt.resume) resumed = read_checkpoint(opt.checkpoint_dir, layout, opt.optimizer.kind == OptimizerKind::lamb ? 2 : 1);
  std::optional<ModelState> init;
  if (!opt.init_from.empty()) init = read_torchvision(opt.init_from, layout);
  const int64_t start = resumed ? resumed->step : 0;
  if (start > opt.steps)
    throw core::InputError(checkpoint_file(opt.checkpoint_dir).string() + " is at step " + std::to_string(start) +
                           ", past --steps " + std::to_string(opt.steps));
  // The CPU and GPU loaders take the same batch, seed, augmentation, start and shard (and so
  // pick the same samples, crops and flips: data/sampling.h).
  auto loader_options = [&]<class Options>(Options o) {
    o.batch = opt.batch;
    o.threads = opt.loader_threads;
    o.seed = opt.seed;
    o.augment.size = opt.image_size;
    o.augment.out = prec.dtype;
    o.first_batch = start * opt.accum;
    if (dp) o.shard = {dp->rank(), dp->world()};
    return o;
  };
  const int64_t folder_images = folder ? int64_t(folder->samples.size()) : 0;
  std::optional<data::Loader> loader;
  if (folder) {
    if (opt.pipeline == "gpu") gpu_folder.emplace(std::move(*folder));
    else loader.emplace(std::move(*folder), loader_options(data::LoaderOptions{}));
  }
  const std::map<std::string, std::string> run_recipe = recipe(opt, classes, folder_images);
  if (resumed) check_same_recipe(opt.checkpoint_dir, resumed->recipe, run_recipe);

  if (const std::string why = core::why_no_device(); !why.empty()) throw core::NoDeviceError("training needs a CUDA device: " + why);

  ModelOptions mo;
  mo.net = net_config;
  mo.batch = opt.batch;
  mo.image_size = opt.image_size;
  mo.dtype = prec.dtype;
  mo.math = prec.math;
  mo.seed = opt.seed;
  mo.label_smoothing = opt.label_smoothing;
  mo.deterministic = opt.deterministic;
  mo.conv_layout = opt.conv_layout;
  mo.workspace_limit = opt.conv_workspace_limit;
  core::Stream stream;
  ResNet net(mo);
  Optimizer optimizer(opt.optimizer, net.optimizer_params(), prec.dtype);
  std::unique_ptr<LossScaler> scaler;
  if (prec.loss_scaling) {
    scaler = std::make_unique<LossScaler>();
    scaler->watch(net.gradient_views());
  }
  const LossScaleState* scale_state = scaler ? scaler->device_state() : nullptr;
  if (init) upload_model(net, *init, stream);
  if (resumed) restore_training(*resumed, net, optimizer, scaler.get(), stream);
  resumed.reset();  // host copies of the whole state
  init.reset();
  const int64_t checkpoint_every =
      opt.checkpoint_every > 0 ? opt.checkpoint_every
      : loader ? std::max<int64_t>(1, loader->batches_per_epoch() / opt.accum) : opt.steps;
  LrSchedule schedule = opt.schedule;
  schedule.total = opt.steps;

  const size_t image_bytes = size_t(opt.batch) * opt.image_size * opt.image_size * 3 * core::dtype_size(prec.dtype);
  core::DeviceBuffer<std::byte> images(image_bytes);
  core::DeviceBuffer<int32_t> labels(size_t(opt.batch));
  std::optional<data::GpuLoader> gpu_loader;
  if (gpu_folder) gpu_loader.emplace(std::move(*gpu_folder), loader_options(data::GpuLoaderOptions{}));
  const int rank = dp ? dp->rank() : 0, world = dp ? dp->world() : 1;
  // Every rank holds the same weights: rank 0 alone evaluates and writes files (checkpoints).
  const bool rank0 = rank == 0;
  if (opt.data.empty()) fill_synthetic(mo, images.get(), labels.get(), opt.seed + 1 + uint64_t(rank));
  if (dp) dp->attach(net, stream);

  // The loader's batch buffers are few and fixed: page-lock each once so copies run at full speed.
  std::vector<const void*> pinned;
  auto pin = [&](const void* p, size_t bytes) {
    if (std::find(pinned.begin(), pinned.end(), p) != pinned.end()) return;
    GPULAB_CHECK(cudaHostRegister(const_cast<void*>(p), bytes, cudaHostRegisterDefault));
    pinned.push_back(p);
  };
  // Unregistered before the loader frees its buffers (at the end of scope, or before evaluation).
  struct Unpin {
    std::vector<const void*>& p;
    void release() {
      for (const void* q : p) GPULAB_CHECK_NOTHROW(cudaHostUnregister(const_cast<void*>(q)));
      p.clear();
    }
    ~Unpin() { release(); }
  } unpin{pinned};
  core::Event copied(cudaEventDisableTiming);
  copied.record(stream);

  TrainReport report;
  report.params = net.param_count();
  report.classes = classes;
  report.start_step = start;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point began = Clock::now();  // the model and loaders are set up
  // Under a compute-sanitizer a step takes seconds to minutes: rank 0 logs each one, so that a run
  // its timeout cuts says how far it got.
  const bool log_each_step = rank == 0 && !core::sanitizer_tool().empty();
  Clock::time_point timed_start;
  Clock::duration untimed_pauses{};  // checkpoint writing
  const int64_t untimed = start + std::min<int64_t>(opt.warmup_steps_untimed, opt.steps - start - 1);
  // NVTX range (a no-op without a tool) spanning exactly the img/s clock, for `gpulab diagnose
  // --capture-range gpulab:train:timed`; a start/end range, as the per-step push/pop ranges nest in it.
  nvtxRangeId_t timed_range = 0;
  auto checkpoint_due = [&](int64_t step) {
    return rank0 && !opt.checkpoint_dir.empty() && ((step + 1) % checkpoint_every == 0 || step + 1 == opt.steps);
  };
  // Each issued step's loss and loss scale come back through a slot of this ring, so the host
  // issues up to `lag` steps past the last one it reported and the GPU never idles at a step
  // boundary. Data parallel stays synchronous: each rank averages each step's loss over the ranks
  // on the host (mean_over_ranks) before the next step, as every rank must agree on it.
  const int lag = dp ? 0 : std::max(opt.report_lag, 0);
  std::vector<StepFigures> ring(size_t(lag) + 1);
  for (auto& f : ring) f.row_loss = core::PinnedBuffer<float>(size_t(opt.batch) * size_t(opt.accum));
  core::CapturedGraph micro_graph[2], update_graph;  // --cuda-graph (below); micro_graph[accumulate]
  core::DeviceBuffer<float> lr_device(1);
  struct DrainOnExit {  // a throw leaves steps queued: they must finish before what they use is freed
    cudaStream_t s;
    ~DrainOnExit() { GPULAB_CHECK_NOTHROW(cudaStreamSynchronize(s)); }
  } drain_on_exit{stream};
  int64_t next_report = start;
  data::StallWatchdog watchdog;  // a step that never finishes on the GPU ends the run (data/stall.h)
  // Reports the oldest unreported step, in step order, once its copies have landed.
  auto report_step = [&] {
    StepFigures& f = ring[size_t(next_report % int64_t(ring.size()))];
    if (dp) {
      dp->wait(stream);  // the NCCL watchdog: a dead peer is an error, not a hang
    } else {
      const auto watched = watchdog.watch([&, step = next_report] {
        return "training: step " + std::to_string(step) + " has not finished on the GPU" +
               (gpu_loader ? "; " + gpu_loader->where() : "");
      });
      f.done.synchronize();
    }
    StepReport r = f.report;
    r.loss_scale = scaler ? f.scale.get()->scale : 1.f;
    // The mean over the step's images, every micro-batch (and, below, every rank): N ranks of
    // batch B and one process accumulating N micro-batches of B report the same loss.
    r.loss = ResNet::mean_loss(f.row_loss.get(), opt.batch * opt.accum);
    if (dp) r.loss = dp->mean_over_ranks(r.loss, stream);  // so every rank also agrees on a non-finite loss
    // Found up to `lag` steps after it was computed (those are queued already); the step named is right.
    if (!std::isfinite(r.loss) && !scaler) throw core::Error("loss is " + std::to_string(r.loss) + " at step " + std::to_string(r.step) + "; lower --lr");
    if (r.step == start) report.first_loss = r.loss;
    report.last_loss = r.loss;
    if (r.step >= untimed) {  // the clock stops once the step has completed on the GPU
      const double seconds = std::chrono::duration<double>(Clock::now() - timed_start - untimed_pauses).count();
      const int64_t images_done = (r.step - untimed + 1) * int64_t(opt.batch) * opt.accum * world;
      r.images_per_second = seconds > 0 ? images_done / seconds : 0;
      report.timed_images = images_done;
      report.timed_seconds = seconds;
      report.images_per_second = r.images_per_second;
      if (r.step + 1 == opt.steps) nvtxRangeEnd(timed_range);
    }
    // Before the report: a run stopped in on_step has its checkpoint. No later step is issued yet
    // (the loop catches up before a checkpoint step), so it holds the state after step + 1 steps.
    if (checkpoint_due(r.step)) {
      const Clock::time_point t0 = Clock::now();
      TrainState st = capture_training(net, optimizer, scaler.get(), stream);
      st.step = r.step + 1;
      st.recipe = run_recipe;
      write_checkpoint(opt.checkpoint_dir, layout, st);
      ++report.checkpoints_written;
      if (r.step >= untimed) untimed_pauses += Clock::now() - t0;
    }
    if (log_each_step)
      core::log_info("train: step ", r.step + 1, " of ", opt.steps, " done at ",
                     std::chrono::duration<double>(Clock::now() - began).count(), " s into the loop, loss ", r.loss);
    ++next_report;
    if (on_step) on_step(r);
  };
  // The step's work; --cuda-graph captures the same calls. Micro-batch `micro` of the step:
  auto micro_batch = [&](int micro) {
    net.forward(images.get(), true, stream);
    if (dp) dp->arm(micro == opt.accum - 1, stream);
    net.backward(labels.get(), 1.f / float(opt.accum), micro > 0, scale_state, stream);
  };
  // Then the update, at a rate given on the host (float) or on the device (const float*).
  auto update = [&](auto lr) {
    if (dp) dp->finish(stream);
    if (scaler) scaler->check_gradients(stream);
    optimizer.step(lr, scale_state, stream);
    if (scaler) scaler->update(stream);
  };
  // --cuda-graph: from the first step after the untimed ones (at least one eager step has made
  // cuBLASLt's plans and loaded the kernels), each micro-batch is one replay (the first writes
  // the gradients, later ones add to them) and the update another; the loaders still copy each
  // batch into the fixed `images` and `labels` before its replay.
  const int64_t graph_from = opt.cuda_graph ? std::max(untimed, start + 1) : opt.steps;
  auto capture_step = [&] {
    // On an idle device with no other thread calling CUDA: the GPU loader's thread fills its
    // slots and waits (its cudaFree or nvJPEG's synchronizations would break the capture).
    if (gpu_loader) gpu_loader->quiesce();
    stream.synchronize();
    const int64_t tracked = net.batches_tracked();  // forward counts; a capture runs nothing
    try {
      for (int micro = 0; micro < std::min(opt.accum, 2); ++micro)
        micro_graph[micro].capture(stream, [&] { micro_batch(micro); });
      update_graph.capture(stream, [&] { update(static_cast<const float*>(lr_device.get())); });
    } catch (const core::Error& e) {
      throw core::Error(std::string("--cuda-graph: ") + e.what() + "; run without --cuda-graph");
    }
    net.set_batches_tracked(tracked);
  };
  for (int64_t step = start; step < opt.steps; ++step) {
    nvtxRangePushA("step");
    if (step == graph_from) capture_step();  // before the clock starts: capturing runs nothing
    StepFigures& f = ring[size_t(step % int64_t(ring.size()))];  // step - lag - 1, its last user, is reported
    // The scale this step uses (only update, at its end, changes it).
    if (scaler) scaler->copy_state(f.scale.get(), stream);
    if (step == untimed) {
      stream.synchronize();
      while (next_report < step) report_step();  // done already: their callbacks stay out of the timing
      timed_start = Clock::now();
      timed_range = nvtxRangeStartA("gpulab:train:timed");
    }
    for (int micro = 0; micro < opt.accum; ++micro) {
      if (loader) {
        copied.synchronize();  // the loader reuses the previous batch's memory in next()
        const data::Batch& b = loader->next();
        pin(b.images.data(), image_bytes);
        GPULAB_CHECK(cudaMemcpyAsync(images.get(), b.images.data(), image_bytes, cudaMemcpyHostToDevice, stream));
        GPULAB_CHECK(cudaMemcpyAsync(labels.get(), b.labels.data(), b.labels.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream));
        copied.record(stream);
      } else if (gpu_loader) {  // a copy keeps `images` fixed for the network (and graph capture)
        // The loader's slot is released in stream order by the next call: a queued step never
        // sees it rewritten, however far the host runs ahead.
        const data::GpuBatch& b = gpu_loader->next(stream);
        GPULAB_CHECK(cudaMemcpyAsync(images.get(), b.images, image_bytes, cudaMemcpyDeviceToDevice, stream));
        GPULAB_CHECK(cudaMemcpyAsync(labels.get(), b.labels, size_t(opt.batch) * sizeof(int32_t),
                                     cudaMemcpyDeviceToDevice, stream));
      }
      if (step < graph_from) {
        micro_batch(micro);
      } else {
        micro_graph[micro > 0].launch(stream);
        net.set_batches_tracked(net.batches_tracked() + 1);
      }
      net.copy_row_losses(f.row_loss.get() + size_t(micro) * size_t(opt.batch), stream);
    }
    f.report = StepReport{};
    f.report.step = step;
    f.report.lr = schedule.at(step);
    if (step < graph_from) {
      update(float(f.report.lr));
    } else {
      *f.lr.get() = float(f.report.lr);
      GPULAB_CHECK(cudaMemcpyAsync(lr_device.get(), f.lr.get(), sizeof(float), cudaMemcpyHostToDevice, stream));
      update_graph.launch(stream);
      ++report.graph_steps;
    }
    f.done.record(stream);
    const int64_t ahead = checkpoint_due(step) ? 0 : lag;
    while (next_report + ahead <= step) report_step();
    nvtxRangePop();
  }
  while (next_report < opt.steps) report_step();
  stream.synchronize();
  if (scaler) report.skipped_steps = scaler->read(stream).skipped_steps;
  if (loader) {
    report.corrupt_skipped = loader->skipped_total();
    report.corrupt_files = loader->corrupt_files();
  }
  if (gpu_loader) {
    report.corrupt_skipped = gpu_loader->skipped_total();
    report.corrupt_files = gpu_loader->corrupt_files();
    report.decoder = gpu_loader->decoder_name();
    gpu_loader.reset();  // its thread and nvJPEG stop before the export and evaluation use the GPU
  }
  report.rank = rank;
  report.world = world;
  if (!opt.export_path.empty() && rank0) write_torchvision(opt.export_path, layout, download_model(net, stream));
  if (opt.eval && !opt.data.empty() && rank0) {
    unpin.release();  // a registration outliving the freed buffers could alias the eval loader's
    loader.reset();
    evaluate(opt, prec.dtype, net, images.get(), labels.get(), stream, report);
  }
  return report;
}

}  // namespace

TrainReport run_training(const TrainOptions& opt, const std::function<void(const StepReport&)>& on_step) {
  TrainReport report;
  std::mutex mutex;
  int reported = -1;
  launch_data_parallel(opt.parallel, [&](DataParallel* dp) {
    const bool rank0 = !dp || dp->rank() == 0;  // progress and results come from rank 0
    TrainReport r = train_rank(opt, dp, rank0 ? on_step : std::function<void(const StepReport&)>{});
    std::lock_guard lock(mutex);
    if (reported < 0 || r.rank < reported) {  // the lowest rank of this process
      reported = r.rank;
      report = std::move(r);
    }
  });
  return report;
}

}  // namespace gpulab::train
