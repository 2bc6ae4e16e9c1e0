// How the training loop issues its steps must change nothing but speed. StepLagGpu: the loop runs
// ahead of its reports (TrainOptions::report_lag), the host issuing up to `lag` steps before it
// reads a step's loss back; per-step reports (in order), final weights, checkpoints and
// non-finite-loss errors are exactly those of the synchronous loop (report_lag 0), on synthetic
// data and through both input pipelines. CudaGraphGpu, CudaGraphReplayGpu: steps replayed from
// CUDA graphs (--cuda-graph) train to the same bits as eager ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "common/gpu.h"
#include "core/error.h"
#include "data/dataset.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train/train_test_util.h"

using namespace gpulab;
using namespace gpulab::train;
using fixtures::temp_dir;
using fixtures::file_bytes;
namespace fs = std::filesystem;

namespace {

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

struct Stopped {};  // thrown from on_step: the run ends there

struct Outcome {
  std::vector<StepReport> steps;
  TrainReport report;
  std::string exported, checkpoint;
};

// One run; with `stop_after` > 0 on_step stops it after that many steps (the checkpoint written
// at that step is what comes back).
Outcome train_once(TrainOptions o, const fs::path& dir, int64_t stop_after = 0) {
  Outcome r;
  fs::create_directories(dir);
  o.export_path = (dir / "export.safetensors").string();
  if (stop_after > 0) {
    o.checkpoint_dir = (dir / "ckpt").string();
    o.checkpoint_every = stop_after;
  }
  auto record = [&](const StepReport& s) {
    r.steps.push_back(s);
    if (stop_after > 0 && s.step + 1 == stop_after) throw Stopped{};
  };
  if (stop_after > 0) {
    EXPECT_THROW(run_training(o, record), Stopped);
    r.checkpoint = file_bytes(checkpoint_file(o.checkpoint_dir));
  } else {
    r.report = run_training(o, record);
    r.exported = file_bytes(o.export_path);
  }
  return r;
}

// Every reported figure and the exported weights, bit for bit.
void expect_same(const Outcome& sync, const Outcome& ahead, int64_t steps) {
  ASSERT_EQ(sync.steps.size(), size_t(steps));
  ASSERT_EQ(ahead.steps.size(), size_t(steps));
  for (size_t i = 0; i < sync.steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_EQ(ahead.steps[i].step, int64_t(i)) << "reports out of order";
    EXPECT_TRUE(std::isfinite(sync.steps[i].loss));
    EXPECT_EQ(bits(ahead.steps[i].loss), bits(sync.steps[i].loss)) << ahead.steps[i].loss << " vs " << sync.steps[i].loss;
    EXPECT_EQ(bits(ahead.steps[i].loss_scale), bits(sync.steps[i].loss_scale));
    EXPECT_EQ(ahead.steps[i].lr, sync.steps[i].lr);
  }
  EXPECT_EQ(bits(ahead.report.first_loss), bits(sync.steps.front().loss));
  EXPECT_EQ(bits(ahead.report.last_loss), bits(sync.steps.back().loss));
  EXPECT_EQ(ahead.report.skipped_steps, sync.report.skipped_steps);
  EXPECT_EQ(ahead.report.timed_images, sync.report.timed_images);
  EXPECT_GT(ahead.report.images_per_second, 0);
  EXPECT_EQ(ahead.report.images_per_second, ahead.steps.back().images_per_second);
  ASSERT_FALSE(sync.exported.empty());
  EXPECT_TRUE(ahead.exported == sync.exported) << "the final weights differ";
}

TrainOptions deterministic_run(const std::string& precision) {
  TrainOptions o = fixtures::tiny_run();
  o.precision = precision;
  o.deterministic = true;
  o.seed = 9;
  o.loader_threads = 3;
  return o;
}

TrainOptions with_lag(TrainOptions o, int lag) {
  o.report_lag = lag;
  return o;
}

TrainOptions with_graph(TrainOptions o) {
  o.cuda_graph = true;
  return o;
}

// A small `shapes` folder: 4 batches of 8 an epoch.
fs::path make_folder(const fs::path& dir) {
  data::MakeOptions mo;
  mo.classes = 4;
  mo.train_images = 8;
  mo.val_images = 1;
  mo.width = 80;
  mo.height = 60;
  mo.seed = 2;
  mo.threads = 4;
  data::make_dataset(dir, mo);
  return dir;
}

// 7 steps on that folder through `pipeline`, 5 under racecheck (tiny_run's reason): one epoch wraps.
TrainOptions folder_run(const fs::path& data, const char* pipeline, const std::string& precision) {
  TrainOptions o = deterministic_run(precision);
  o.data = data.string();
  o.pipeline = pipeline;
  o.steps = under_racecheck() ? 5 : 7;
  return o;
}

}  // namespace

TEST(StepLagGpu, RunningAheadReportsAndTrainsBitForBitAsTheSynchronousLoop) {
  GPULAB_REQUIRE_GPU();
  const fs::path dir = temp_dir("step_lag");
  // Under racecheck: accumulation 2 only (its first micro-batch is an accumulation-1 step) and
  // lag 2 only (the lag is the host's). Lag 11 is more steps than the run has.
  const std::vector<int> accums = under_racecheck() ? std::vector<int>{2} : std::vector<int>{1, 2};
  const std::vector<int> lags = under_racecheck() ? std::vector<int>{2} : std::vector<int>{2, 11};
  for (const char* precision : {"fp16", "fp32"}) {
    for (int accum : accums) {
      SCOPED_TRACE(std::string(precision) + " accum " + std::to_string(accum));
      TrainOptions o = deterministic_run(precision);
      o.accum = accum;
      const std::string tag = std::string(precision) + "_" + std::to_string(accum);
      const Outcome sync = train_once(with_lag(o, 0), dir / (tag + "_0"));
      if (std::string(precision) == "fp16") {
        EXPECT_EQ(sync.steps[0].loss_scale, 65536.f);  // the loss scaler is in play
      }
      for (int lag : lags) {
        SCOPED_TRACE("lag " + std::to_string(lag));
        expect_same(sync, train_once(with_lag(o, lag), dir / (tag + "_" + std::to_string(lag))), o.steps);
      }
    }
  }
  fs::remove_all(dir);
}

TEST(StepLagGpu, CheckpointHoldsTheStateAfterExactlyItsStep) {
  // Stopped from on_step at step 3 of 8 (of 4 under racecheck) with a checkpoint every 3 steps: a
  // loop that ran ahead without catching up first would save the weights of step 4 or 5.
  GPULAB_REQUIRE_GPU();
  const fs::path dir = temp_dir("step_lag_ckpt");
  const TrainOptions o = deterministic_run("fp16");
  const Outcome sync = train_once(with_lag(o, 0), dir / "0", 3);
  const Outcome ahead = train_once(with_lag(o, 2), dir / "2", 3);
  fs::remove_all(dir);
  ASSERT_EQ(ahead.steps.size(), 3u);
  ASSERT_FALSE(sync.checkpoint.empty());
  EXPECT_TRUE(ahead.checkpoint == sync.checkpoint) << "the checkpoint holds another state";
}

TEST(StepLagGpu, BothInputPipelinesFeedTheSameBatchesWhenRunningAhead) {
  // The CPU loader reuses its batch memory and the GPU loader its device slots: running ahead
  // must never let a queued step see the next batch. 4 batches an epoch, 7 steps: one wraps.
  // Under racecheck no repeat run: it launches the same kernels.
  GPULAB_REQUIRE_GPU();
  const fs::path dir = temp_dir("step_lag_data");
  const fs::path data = make_folder(dir / "data");
  for (const char* pipeline : {"cpu", "gpu"}) {
    SCOPED_TRACE(std::string("pipeline ") + pipeline);
    const TrainOptions o = folder_run(data, pipeline, "fp32");
    const Outcome sync = train_once(with_lag(o, 0), dir / (std::string(pipeline) + "_0"));
    // If the pipeline itself does not repeat, the comparison below says nothing.
    if (!under_racecheck()) {
      const Outcome again = train_once(with_lag(o, 0), dir / (std::string(pipeline) + "_0b"));
      ASSERT_TRUE(again.exported == sync.exported) << "two synchronous runs differ";
    }
    expect_same(sync, train_once(with_lag(o, 2), dir / (std::string(pipeline) + "_2")), o.steps);
  }
  fs::remove_all(dir);
}

TEST(StepLagGpu, NonFiniteLossStillStopsTheRunAtTheSameStep) {
  // An infinite learning rate turns the weights to inf/NaN after step 0: step 1's loss is NaN.
  // Without a loss scaler that is an error, found up to `lag` steps later but naming step 1, and
  // every step before it was reported as in the synchronous loop.
  GPULAB_REQUIRE_GPU();
  std::string message[2];
  std::vector<int64_t> seen[2];
  for (int k = 0; k < 2; ++k) {
    TrainOptions o = deterministic_run("fp32");
    o.schedule.base = INFINITY;
    o.report_lag = k == 0 ? 0 : 2;
    try {
      run_training(o, [&](const StepReport& s) { seen[k].push_back(s.step); });
      ADD_FAILURE() << "lag " << o.report_lag << ": a NaN loss did not stop the run";
    } catch (const core::Error& e) {
      message[k] = e.what();
    }
  }
  EXPECT_NE(message[0].find("at step 1;"), std::string::npos) << message[0];
  EXPECT_EQ(message[1], message[0]);
  EXPECT_EQ(seen[0], std::vector<int64_t>{0});
  EXPECT_EQ(seen[1], seen[0]);
}

// One replay case a test, so that racecheck, which runs a case for minutes, can take them apart
// and side by side (session 46: three of the five in one test outlasted a device call).
namespace {

struct ReplayCase {
  const char* precision;
  const char* optimizer;
  int accum;
};

std::string case_tag(const ReplayCase& c) {
  return std::string(c.precision) + "_" + c.optimizer + "_accum" + std::to_string(c.accum);
}

// How gtest (and so ctest's test names) prints a case, instead of its bytes.
void PrintTo(const ReplayCase& c, std::ostream* os) { *os << case_tag(c); }

class CudaGraphReplayGpu : public testing::TestWithParam<ReplayCase> {};

}  // namespace

TEST_P(CudaGraphReplayGpu, StepsTrainBitForBitAsEagerOnes) {
  // tiny_run: 2 untimed steps, so steps 2..7 replay (2..3 under racecheck); the warmup-then-cosine
  // rate changes every step (a rate frozen at capture would show), and the export holds
  // num_batches_tracked.
  GPULAB_REQUIRE_GPU();
  const ReplayCase c = GetParam();
  const fs::path dir = temp_dir("cuda_graph_" + case_tag(c));
  TrainOptions o = deterministic_run(c.precision);
  const OptimizerKind kind = optimizer_from_name(c.optimizer);
  o.optimizer.kind = kind;
  o.optimizer.weight_decay = kind == OptimizerKind::lamb ? 0.01f : 5e-5f;
  o.schedule.base = kind == OptimizerKind::lamb ? 0.005 : kind == OptimizerKind::lars ? 0.5 : 0.05;
  // Under racecheck at most 2 micro-batches a step: a third launches the same kernels again.
  o.accum = under_racecheck() ? std::min(c.accum, 2) : c.accum;
  const Outcome eager = train_once(o, dir / "eager");
  const Outcome graph = train_once(with_graph(o), dir / "graph");
  EXPECT_EQ(eager.report.graph_steps, 0);
  EXPECT_EQ(graph.report.graph_steps, o.steps - o.warmup_steps_untimed);
  expect_same(eager, graph, o.steps);
  // And run to run: a graph run repeats itself.
  if (!under_racecheck()) {
    EXPECT_TRUE(train_once(with_graph(o), dir / "graph2").exported == graph.exported);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGraphReplayGpu,
                         testing::Values(ReplayCase{"fp32", "sgd", 1}, ReplayCase{"fp16", "sgd", 1},
                                         ReplayCase{"fp16", "lars", 2}, ReplayCase{"fp32", "lamb", 3},
                                         ReplayCase{"bf16", "sgd", 2}),
                         [](const testing::TestParamInfo<ReplayCase>& info) { return case_tag(info.param); });

TEST(CudaGraphGpu, CheckpointAndResumeAcrossReplays) {
  // A graph run stopped at step 5 (checkpoint) and resumed with the graph equals the eager run:
  // 8 steps, under racecheck too, so that both halves replay.
  GPULAB_REQUIRE_GPU();
  const fs::path dir = temp_dir("cuda_graph_ckpt");
  TrainOptions o = deterministic_run("fp16");
  o.steps = 8;
  const Outcome eager = train_once(o, dir / "eager", 5);
  const Outcome graph = train_once(with_graph(o), dir / "graph", 5);
  ASSERT_FALSE(eager.checkpoint.empty());
  EXPECT_TRUE(graph.checkpoint == eager.checkpoint) << "the graph run's checkpoint at step 5 differs";
  TrainOptions resumed = with_graph(o);
  resumed.checkpoint_dir = (dir / "graph" / "ckpt").string();
  resumed.resume = true;
  resumed.export_path = (dir / "resumed.safetensors").string();
  const TrainReport r = run_training(resumed);
  EXPECT_EQ(r.start_step, 5);
  EXPECT_EQ(r.graph_steps, 1);  // steps 5 and 6 are this run's untimed ones: step 7 replays
  const Outcome whole = train_once(o, dir / "whole");
  EXPECT_TRUE(file_bytes(resumed.export_path) == whole.exported) << "the resumed graph run ends elsewhere";
  fs::remove_all(dir);
}

TEST(CudaGraphGpu, BothInputPipelinesFeedTheReplays) {
  GPULAB_REQUIRE_GPU();
  const fs::path dir = temp_dir("cuda_graph_data");
  const fs::path data = make_folder(dir / "data");
  for (const char* pipeline : {"cpu", "gpu"}) {
    SCOPED_TRACE(std::string("pipeline ") + pipeline);
    TrainOptions o = folder_run(data, pipeline, "fp16");
    o.accum = 2;  // a new batch before each micro-batch's replay
    const Outcome eager = train_once(o, dir / (std::string(pipeline) + "_eager"));
    if (!under_racecheck()) {  // no repeat run there: the same kernels again
      const Outcome again = train_once(o, dir / (std::string(pipeline) + "_again"));
      ASSERT_TRUE(again.exported == eager.exported) << "two eager runs differ";
    }
    const Outcome graph = train_once(with_graph(o), dir / (std::string(pipeline) + "_graph"));
    EXPECT_EQ(graph.report.graph_steps, o.steps - o.warmup_steps_untimed);
    expect_same(eager, graph, o.steps);
  }
  fs::remove_all(dir);
}

TEST(CudaGraphGpu, RefusedWithDataParallel) {
  GPULAB_REQUIRE_GPU();
  TrainOptions o = with_graph(deterministic_run("fp32"));
  o.parallel.nccl = true;  // one rank through NCCL: data parallel all the same
  try {
    run_training(o);
    ADD_FAILURE() << "--cuda-graph ran with data parallel";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graph"), std::string::npos) << e.what();
  }
}
