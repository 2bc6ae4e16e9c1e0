// Data parallelism on the GPU. One GPU: a world of one through NCCL must give the plain path's
// weights bit for bit. N >= 2 GPUs: N ranks of batch B must match one GPU that accumulates the
// same N micro-batches of B. That comparison is exact in the maths because BatchNorm normalises
// each micro-batch of B on its own in both runs (a single GPU with one batch of N·B would
// normalise over N·B, which per-rank BatchNorm without synchronisation never does); only the
// order of floating-point sums differs. BN running statistics differ too (each rank keeps its
// own), but they do not enter training.
//
// Weights are compared after ONE step: this tiny model (BatchNorm over 4 images, 1x1 maps in
// layer4, lr 0.05 with momentum) multiplies a rounding difference by about 50 a step (the one-rank
// batch-norm test below saw 5e-5 after one step become 16 % after three), so runs that differ only
// in the order of sums end several steps apart by percents (on 2 H200s, fp32: 7.6 % after four
// steps, the losses of the first three within 1e-5; a bf16 wire: 40 %). Every step is checked
// where rounding cannot grow: each rank's reduced gradients, element by element, against the
// average of the ranks' own gradients of that step (tests/train/allreduce_check.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "common/gpu.h"
#include "core/error.h"
#include "core/memory.h"
#include "train/allreduce_check.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"
#include "train/resnet.h"
#include "train/trainer.h"
#include "train/train_test_util.h"

using namespace gpulab;
using namespace gpulab::train;

namespace {

constexpr int kStreamBatch = 4;  // images per batch of the data stream

ModelOptions tiny_model(core::DType dtype, int stream_batches = 1) {
  ModelOptions mo;
  mo.net = {18, 10, 16, false};
  mo.batch = kStreamBatch * stream_batches;
  mo.image_size = 32;
  mo.dtype = dtype;
  mo.math = core::MathMode::strict_fp32;
  mo.seed = 5;
  mo.deterministic = true;  // runs compared bit for bit need cuDNN's deterministic algorithms
  return mo;
}

// Batches first, first + 1, ... of a fixed random stream, concatenated into one batch of
// mo.batch images: the same bytes whichever rank or run asks.
void upload_batch(int64_t first, const ModelOptions& mo, void* images, int32_t* labels, cudaStream_t s) {
  const size_t per_image = size_t(mo.image_size) * mo.image_size * 3, n = size_t(mo.batch) * per_image;
  std::vector<float> f(n);
  std::vector<uint16_t> h(n);
  std::vector<int32_t> l(size_t(mo.batch));
  for (int b = 0; b < mo.batch / kStreamBatch; ++b) {
    std::mt19937_64 rng(0x5eed + uint64_t(first + b));
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (size_t i = size_t(b) * kStreamBatch * per_image; i < size_t(b + 1) * kStreamBatch * per_image; ++i) {
      f[i] = u(rng);
      h[i] = mo.dtype == core::DType::bf16 ? core::float_to_bf16_bits(f[i]) : core::float_to_f16_bits(f[i]);
    }
    for (int j = 0; j < kStreamBatch; ++j) l[size_t(b * kStreamBatch + j)] = int32_t(rng() % uint64_t(mo.net.classes));
  }
  const void* src = mo.dtype == core::DType::f32 ? static_cast<const void*>(f.data()) : h.data();
  GPULAB_CHECK(cudaMemcpyAsync(images, src, n * core::dtype_size(mo.dtype), cudaMemcpyHostToDevice, s));
  GPULAB_CHECK(cudaMemcpyAsync(labels, l.data(), l.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  GPULAB_CHECK(cudaStreamSynchronize(s));  // the host vectors die here
}

struct TrainedWeights {
  std::vector<float> init, first, params;  // before training, after its first step, at the end
  std::vector<float> losses;  // per step, per micro-batch
  size_t buckets = 0;
  // With record_grads: per step, this rank's own gradients and the reduced ones.
  std::vector<std::vector<float>> local_grads, reduced_grads;
};

std::vector<float> download(const float* p, int64_t n, cudaStream_t s) {
  std::vector<float> h(static_cast<size_t>(n));
  GPULAB_CHECK(cudaMemcpyAsync(h.data(), p, h.size() * 4, cudaMemcpyDeviceToHost, s));
  GPULAB_CHECK(cudaStreamSynchronize(s));
  return h;
}

// `steps` SGD steps of `accum` micro-batches; this rank's micro-batch m of step k is batch
// (k·accum + m)·world + rank of the stream, as the sharded loader hands them out (a model batch of
// several stream batches takes that many consecutive ones). `record_grads` (data parallel, accum
// 1): each step's backward runs twice, unarmed for this rank's own gradients, then armed (the same
// gradients, deterministic algorithms) for the reduced ones.
TrainedWeights train_steps(const ModelOptions& mo, DataParallel* dp, int accum, int steps, bool record_grads = false) {
  const int rank = dp ? dp->rank() : 0, world = dp ? dp->world() : 1;
  core::Stream s;
  ResNet net(mo);
  OptimizerConfig oc;
  oc.momentum = 0.9f;
  oc.weight_decay = 1e-4f;
  Optimizer opt(oc, net.optimizer_params(), mo.dtype);
  TrainedWeights run;
  if (dp) dp->attach(net, s);
  if (dp) run.buckets = dp->buckets().size();
  run.init = download(net.params(), net.param_count(), s);
  core::DeviceBuffer<std::byte> images(size_t(mo.batch) * mo.image_size * mo.image_size * 3 * core::dtype_size(mo.dtype));
  core::DeviceBuffer<int32_t> labels(size_t(mo.batch));
  for (int k = 0; k < steps; ++k) {
    for (int m = 0; m < accum; ++m) {
      upload_batch(((int64_t(k) * accum + m) * world + rank) * (mo.batch / kStreamBatch), mo, images.get(), labels.get(), s);
      net.forward(images.get(), true, s);
      if (record_grads) {
        dp->arm(false, s);
        net.backward(labels.get(), 1.f, false, nullptr, s);
        run.local_grads.push_back(download(net.grads(), net.param_count(), s));
      }
      if (dp) dp->arm(m == accum - 1, s);
      net.backward(labels.get(), 1.f / float(accum), m > 0, nullptr, s);
      run.losses.push_back(net.last_loss(s));
    }
    if (dp) dp->finish(s);
    if (record_grads) run.reduced_grads.push_back(download(net.grads(), net.param_count(), s));
    opt.step(0.05f, nullptr, s);
    if (dp) dp->wait(s);
    if (k == 0) run.first = download(net.params(), net.param_count(), s);
  }
  run.params = download(net.params(), net.param_count(), s);
  return run;
}

// |a - b| over |ref - init|: the difference in what training changed, after all steps or (`first`)
// after the first.
double relative_update_error(const TrainedWeights& a, const TrainedWeights& ref, bool first = false) {
  const std::vector<float>&pa = first ? a.first : a.params, &pr = first ? ref.first : ref.params;
  double diff = 0, update = 0;
  for (size_t i = 0; i < pr.size(); ++i) {
    if (!std::isfinite(pa[i])) return INFINITY;
    diff += std::pow(double(pa[i]) - pr[i], 2);
    update += std::pow(double(pr[i]) - ref.init[i], 2);
  }
  return std::sqrt(diff / update);
}

}  // namespace

TEST(DataParallelGpu, WorldOfOneThroughNcclIsBitIdenticalToThePlainPath) {
  GPULAB_REQUIRE_GPU();
  for (const core::DType dtype : {core::DType::f32, core::DType::bf16}) {
    SCOPED_TRACE(std::string(core::dtype_name(dtype)));
    const ModelOptions mo = tiny_model(dtype);
    const TrainedWeights plain = train_steps(mo, nullptr, 2, 3);
    comm::Communicator comm(comm::make_unique_id(), 0, 1, 0);
    DataParallelOptions dpo;
    dpo.bucket_bytes = 64 << 10;  // many small buckets, launched all through backward
    DataParallel dp(comm, dpo);
    const TrainedWeights nccl = train_steps(mo, &dp, 2, 3);
    EXPECT_GT(nccl.buckets, 10u);
    ASSERT_EQ(nccl.params.size(), plain.params.size());
    EXPECT_EQ(std::memcmp(nccl.params.data(), plain.params.data(), plain.params.size() * 4), 0)
        << "weights after 3 steps differ";
    EXPECT_EQ(nccl.losses, plain.losses);
    EXPECT_NE(plain.params, plain.init) << "training moved the weights";
  }
}

TEST(DataParallelGpu, EveryGpuAsARankEqualsOneGpuAccumulatingTheSameMicroBatches) {
  GPULAB_REQUIRE_GPU();
  const int world = visible_gpus();
  if (world < 2) GTEST_SKIP() << "needs 2 GPUs, " << world << " visible";
  const ModelOptions mo = tiny_model(core::DType::f32);
  const int steps = 4;
  GPULAB_CHECK(cudaSetDevice(0));
  const TrainedWeights single = train_steps(mo, nullptr, world, steps);
  // The first step's update on the wire: fp32 differs from the single GPU's accumulation only in
  // how cuBLAS and cuDNN add onto existing gradients (expected ~1e-7); bf16 and fp16 round every
  // gradient (~2e-3 and ~3e-4).
  for (const auto& [dtype, tolerance] : {std::pair{core::DType::f32, 1e-5}, std::pair{core::DType::bf16, 1e-2},
                                          std::pair{core::DType::f16, 5e-3}}) {
    SCOPED_TRACE("all-reduce in " + std::string(core::dtype_name(dtype)));
    std::vector<TrainedWeights> ranks(static_cast<size_t>(world));
    const comm::UniqueId id = comm::make_unique_id();
    comm::run_on_gpus(world, [&](int rank) {
      comm::Communicator comm(id, rank, world, rank, comm::CommOptions{std::chrono::seconds(120)});
      DataParallelOptions dpo;
      dpo.bucket_bytes = 256 << 10;
      dpo.allreduce_dtype = dtype;
      DataParallel dp(comm, dpo);
      ranks[size_t(rank)] = train_steps(mo, &dp, 1, steps, true);
      core::Stream s;
      EXPECT_NEAR(dp.mean_over_ranks(float(2 * rank + 1), s), float(world), 1e-5 * world) << "mean of 1, 3, 5, ...";
    });
    EXPECT_GT(ranks[0].buckets, 5u) << "buckets launched all through backward";
    for (int r = 1; r < world; ++r)
      EXPECT_EQ(std::memcmp(ranks[size_t(r)].params.data(), ranks[0].params.data(), ranks[0].params.size() * 4), 0)
          << "rank " << r << " drifted from rank 0: every rank must take the same step";
    const double err = relative_update_error(ranks[0], single, true);
    std::printf("%s wire: relative error of the first step's update %.3g, of all %d steps' %.3g (rounding grown)\n",
                std::string(core::dtype_name(dtype)).c_str(), err, steps, relative_update_error(ranks[0], single));
    EXPECT_LT(err, tolerance) << "weights after the first step vs one GPU with accumulation";
    // Every step's reduction, element by element, on every rank.
    std::vector<std::vector<float>> locals(static_cast<size_t>(world));
    for (int k = 0; k < steps; ++k) {
      for (int r = 0; r < world; ++r) locals[size_t(r)] = ranks[size_t(r)].local_grads[size_t(k)];
      for (int r = 0; r < world; ++r) {
        const auto c = fixtures::check_average(locals, ranks[size_t(r)].reduced_grads[size_t(k)], dtype);
        EXPECT_EQ(c.bad, 0u) << "step " << k << " rank " << r << ": " << c.bad << " reduced gradients off the ranks' average, first "
                             << c.first << ": " << c.got << " for " << c.want << " (bound " << c.bound << ")";
      }
    }
    // Rank r's loss at step k is the single run's micro-batch r of step k: the same forward while
    // the weights agree (step 0), and after the first update.
    for (int k = 0; k < 2; ++k)
      for (int r = 0; r < world; ++r) {
        const float a = ranks[size_t(r)].losses[size_t(k)], b = single.losses[size_t(k * world + r)];
        EXPECT_NEAR(a, b, (k == 0 || dtype == core::DType::f32 ? 1e-5 : 1e-2) * std::fabs(b)) << "step " << k << " rank " << r;
      }
  }
}

// One step of our own batch-norm kernels (world of one) against cuDNN's. Rounding differences
// grow over steps as fast as the gradients amplify them (after 3 steps the two fp32 runs were
// 16 % apart on the H200; torchvision's own fp32 gradients of ResNet-50 at init are 2.5 % from
// float64), so one step is compared: fp32 to 1e-3 (measured 5e-5). bf16 rounding alone moves a
// step's update by tens of percent, so in bf16 each implementation is measured against cuDNN's
// fp32 step and ours must be no further from it than cuDNN's bf16 is (1.5x).
TEST(DataParallelGpu, SyncBatchNormOfOneRankTracksCudnnBatchNorm) {
  GPULAB_REQUIRE_GPU();
  const TrainedWeights cudnn32 = train_steps(tiny_model(core::DType::f32), nullptr, 2, 1);
  for (const core::DType dtype : {core::DType::f32, core::DType::bf16}) {
    const std::string name(core::dtype_name(dtype));
    SCOPED_TRACE(name);
    const ModelOptions mo = tiny_model(dtype);
    const TrainedWeights cudnn = dtype == core::DType::f32 ? cudnn32 : train_steps(mo, nullptr, 2, 1);
    comm::Communicator comm(comm::make_unique_id(), 0, 1, 0);
    DataParallelOptions dpo;
    dpo.sync_batchnorm = true;
    DataParallel dp(comm, dpo);
    const TrainedWeights own = train_steps(mo, &dp, 2, 1);
    const double own_err = relative_update_error(own, cudnn32), cudnn_err = relative_update_error(cudnn, cudnn32);
    std::printf("%s: relative update error after one step against cuDNN fp32: own batch norm %.3g, cuDNN %.3g\n",
                name.c_str(), own_err, cudnn_err);
    EXPECT_LT(own_err, dtype == core::DType::f32 ? 1e-3 : 1.5 * cudnn_err);
    for (size_t i = 0; i < cudnn.losses.size(); ++i)
      EXPECT_NEAR(own.losses[i], cudnn.losses[i], (dtype == core::DType::f32 ? 1e-5 : 2e-2) * cudnn.losses[i]) << i;
  }
}

// With BatchNorm over the global batch, N ranks of B images are one GPU with N·B images; without
// it they are not, which shows that the comparison can tell. Our batch norm against cuDNN's, so
// weights after one step, as above (on 2 H200s, after 4 steps: 0.94 %, with every step's mean loss
// within 1e-4).
TEST(DataParallelGpu, SyncBatchNormOnEveryGpuEqualsOneGpuWithTheGlobalBatch) {
  GPULAB_REQUIRE_GPU();
  const int world = visible_gpus();
  if (world < 2) GTEST_SKIP() << "needs 2 GPUs, " << world << " visible";
  const int steps = 2;
  GPULAB_CHECK(cudaSetDevice(0));
  const TrainedWeights global = train_steps(tiny_model(core::DType::f32, world), nullptr, 1, steps);
  double error[2] = {0, 0};
  for (const bool sync : {true, false}) {
    std::vector<TrainedWeights> ranks(static_cast<size_t>(world));
    const comm::UniqueId id = comm::make_unique_id();
    comm::run_on_gpus(world, [&](int rank) {
      comm::Communicator comm(id, rank, world, rank, comm::CommOptions{std::chrono::seconds(120)});
      DataParallelOptions dpo;
      dpo.sync_batchnorm = sync;
      DataParallel dp(comm, dpo);
      ranks[size_t(rank)] = train_steps(tiny_model(core::DType::f32), &dp, 1, steps);
    });
    error[sync] = relative_update_error(ranks[0], global, true);
    std::printf("%s BatchNorm: relative error of the first step's update %.3g\n", sync ? "synchronised" : "per-rank",
                error[sync]);
    if (!sync) continue;
    for (int k = 0; k < steps; ++k) {  // the global batch's loss is the mean of the ranks'
      double mean = 0;
      for (const auto& r : ranks) mean += r.losses[size_t(k)] / world;
      EXPECT_NEAR(mean, global.losses[size_t(k)], 1e-4 * global.losses[size_t(k)]) << "step " << k;
    }
  }
  EXPECT_LT(error[true], 1e-3) << "sync BN vs one GPU with the global batch";
  EXPECT_GT(error[false], 10 * error[true]) << "per-rank BN should differ from the global batch";
}

namespace {
TrainOptions tiny_training() {
  TrainOptions o;
  o.depth = 18;
  o.width = fixtures::test_width();
  o.classes = 10;
  o.image_size = 32;
  o.batch = 8;
  o.accum = 2;
  o.steps = 5;
  o.warmup_steps_untimed = 1;
  o.schedule.base = 0.05;
  o.deterministic = true;  // runs compared bit for bit
  return o;
}
}  // namespace

TEST(DataParallelGpu, TrainerWorldOfOneThroughNcclReportsThePlainLosses) {
  GPULAB_REQUIRE_GPU();
  for (const char* precision : {"fp32", "fp16"}) {
    SCOPED_TRACE(precision);
    TrainOptions o = tiny_training();
    o.precision = precision;
    std::vector<StepReport> plain, nccl;
    run_training(o, [&](const StepReport& s) { plain.push_back(s); });
    o.parallel.nccl = true;
    o.parallel.bucket_bytes = 32 << 10;
    const TrainReport r = run_training(o, [&](const StepReport& s) { nccl.push_back(s); });
    ASSERT_EQ(nccl.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(nccl[i].loss, plain[i].loss) << "step " << i;
      EXPECT_EQ(nccl[i].loss_scale, plain[i].loss_scale) << "step " << i;
    }
    EXPECT_EQ(r.rank, 0);
    EXPECT_EQ(r.world, 1);
  }
}

TEST(DataParallelGpu, TrainerOnEveryGpuReportsFromRankZeroOnly) {
  GPULAB_REQUIRE_GPU();
  const int world = visible_gpus();
  if (world < 2) GTEST_SKIP() << "needs 2 GPUs, " << world << " visible";
  TrainOptions o = tiny_training();
  o.precision = "bf16";
  o.parallel.gpus = world;
  o.parallel.allreduce_dtype = core::DType::bf16;
  o.parallel.sync_batchnorm = true;  // the whole path: bf16 model, bf16 wire, BatchNorm over all GPUs
  std::mutex mutex;
  std::vector<StepReport> steps;
  const TrainReport r = run_training(o, [&](const StepReport& s) {
    std::lock_guard lock(mutex);
    steps.push_back(s);
  });
  ASSERT_EQ(steps.size(), size_t(o.steps)) << "one progress callback per step, from rank 0 alone";
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].step, int64_t(i));
    EXPECT_TRUE(std::isfinite(steps[i].loss));
  }
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world, world);
  EXPECT_EQ(r.timed_images, (o.steps - 1) * o.batch * o.accum * world) << "throughput counts every rank's images";
  EXPECT_GT(r.images_per_second, 0);
}

TEST(DataParallelGpu, BadOptionsAreInputErrors) {
  GPULAB_REQUIRE_GPU();
  TrainOptions o = tiny_training();
  o.parallel.gpus = visible_gpus() + 1;
  EXPECT_THROW(run_training(o), core::InputError);
  o.parallel.gpus = 1;
  o.parallel.nccl = true;
  o.parallel.bucket_bytes = 0;
  EXPECT_THROW(run_training(o), core::InputError);
}
