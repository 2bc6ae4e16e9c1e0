// Checkpoints on the GPU: a run stopped after N of 2N steps and resumed continues bit for bit
// like the uninterrupted run (losses, weights, BN statistics, optimizer and scaler state), on
// synthetic data and on a JPEG folder; --init-from takes an export back exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "common/gpu.h"
#include "core/safetensors.h"
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

TrainOptions tiny_run(const std::string& precision, OptimizerKind kind) {
  TrainOptions o = fixtures::tiny_run();
  o.precision = precision;
  o.optimizer.kind = kind;
  o.optimizer.weight_decay = kind == OptimizerKind::lamb ? 0.01f : 5e-5f;
  o.schedule.base = kind == OptimizerKind::lamb ? 0.005 : kind == OptimizerKind::lars ? 0.5 : 0.05;
  o.seed = 5;
  o.deterministic = true;
  o.loader_threads = 3;
  return o;
}

struct Stopped {};  // thrown from on_step: the run ends there, as if killed after a checkpoint

struct RunResult {
  std::vector<float> losses;  // per step of this run
  std::string checkpoint, exported;  // the final files' bytes
};

// A whole run; with `stop_after` > 0 it ends after that many steps, then resumes to the end.
RunResult run(TrainOptions o, const fs::path& dir, int64_t stop_after) {
  RunResult r;
  o.checkpoint_dir = (dir / "ckpt").string();
  o.export_path = (dir / "export.safetensors").string();
  auto record = [&](const StepReport& s) {
    r.losses.push_back(s.loss);
    if (stop_after > 0 && s.step + 1 == stop_after) throw Stopped{};
  };
  if (stop_after > 0) {
    o.checkpoint_every = stop_after;
    EXPECT_THROW(run_training(o, record), Stopped);
    EXPECT_FALSE(fs::exists(o.export_path));
    o.resume = true;
    stop_after = 0;
    const TrainReport rep = run_training(o, record);
    EXPECT_EQ(rep.start_step, o.checkpoint_every);
  } else {
    run_training(o, record);
  }
  r.checkpoint = file_bytes(checkpoint_file(o.checkpoint_dir));
  r.exported = file_bytes(o.export_path);
  return r;
}

// Uninterrupted twice (the run is reproducible at all), then stopped at half and resumed. Under
// racecheck uninterrupted once (under_racecheck, common/gpu.h): the repeat launches the same kernels.
void expect_resume_bit_identical(const TrainOptions& o, const std::string& tag) {
  const fs::path dir = temp_dir(tag);
  const RunResult a = run(o, dir / "a", 0);
  std::optional<RunResult> b;
  if (!under_racecheck()) b = run(o, dir / "b", 0);
  const RunResult c = run(o, dir / "c", o.steps / 2);
  fs::remove_all(dir);
  ASSERT_EQ(a.losses.size(), size_t(o.steps));
  ASSERT_FALSE(a.checkpoint.empty());
  ASSERT_FALSE(a.exported.empty());
  for (float l : a.losses) EXPECT_TRUE(std::isfinite(l));
  // Two uninterrupted runs: if these differ, the model itself is not deterministic.
  if (b) {
    EXPECT_EQ(std::memcmp(a.losses.data(), b->losses.data(), a.losses.size() * 4), 0) << "uninterrupted runs differ";
    EXPECT_TRUE(a.checkpoint == b->checkpoint) << "uninterrupted runs end in different states";
  }
  ASSERT_EQ(c.losses.size(), a.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a.losses[i], 4);
    std::memcpy(&y, &c.losses[i], 4);
    EXPECT_EQ(x, y) << "step " << i << ": uninterrupted " << a.losses[i] << ", resumed " << c.losses[i];
  }
  // Weights, BN statistics, momentum/moments, optimizer step count, loss scaler, step: the same bytes.
  EXPECT_TRUE(a.checkpoint == c.checkpoint) << "the resumed run ends in another state";
  EXPECT_TRUE(a.exported == c.exported) << "the resumed run exports other weights";
}

}  // namespace

TEST(CheckpointGpu, ResumeIsBitIdenticalOnSyntheticData) {
  GPULAB_REQUIRE_GPU();
  expect_resume_bit_identical(tiny_run("fp32", OptimizerKind::sgd), "fp32_sgd");
  TrainOptions lamb = tiny_run("fp16", OptimizerKind::lamb);  // two moments, the loss scaler
  lamb.accum = 2;
  expect_resume_bit_identical(lamb, "fp16_lamb");
  expect_resume_bit_identical(tiny_run("bf16", OptimizerKind::lars), "bf16_lars");
}

TEST(CheckpointGpu, ResumeIsBitIdenticalOnJpegFolder) {
  GPULAB_REQUIRE_GPU();
  const fs::path data = temp_dir("ckpt_shapes");
  // 60 images: 7 batches of 8 per epoch, and 10 steps of 2: the resumed half starts mid-epoch
  // (batch 10). Under racecheck 24 images, 3 batches, and 4 steps (tiny_run's reason): batch 4.
  data::MakeOptions mo;
  mo.classes = 3;
  mo.train_images = under_racecheck() ? 8 : 20;
  mo.val_images = 2;
  mo.width = 64;
  mo.height = 48;
  mo.seed = 9;
  mo.threads = 4;
  data::make_dataset(data, mo);
  TrainOptions o = tiny_run("tf32", OptimizerKind::sgd);
  o.data = data.string();
  o.accum = 2;
  o.steps = under_racecheck() ? 4 : 10;
  expect_resume_bit_identical(o, "folder");
  fs::remove_all(data);
}

TEST(CheckpointGpu, ResumeRefusesOtherOptions) {
  GPULAB_REQUIRE_GPU();
  const fs::path dir = temp_dir("ckpt_refuse");
  TrainOptions o = tiny_run("fp32", OptimizerKind::sgd);
  o.steps = 2;
  o.checkpoint_dir = (dir / "ckpt").string();
  run_training(o);
  o.resume = true;
  o.batch = 4;
  try {
    run_training(o);
    ADD_FAILURE() << "resumed with another batch size";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("batch = 8, this run has 4"), std::string::npos) << e.what();
  }
  o.batch = 8;
  o.optimizer.kind = OptimizerKind::lamb;  // its moments are not in an SGD checkpoint
  EXPECT_THROW(run_training(o), core::InputError);
  fs::remove_all(dir);
}

// An export loaded with --init-from gives back the same weights: one step at lr 0 changes no
// parameter (only the BN running statistics, which a training forward updates).
TEST(CheckpointGpu, InitFromTakesAnExportBackExactly) {
  GPULAB_REQUIRE_GPU();
  const fs::path dir = temp_dir("ckpt_init");
  for (const char* precision : {"fp32", "fp16"}) {
    SCOPED_TRACE(precision);
    TrainOptions o = tiny_run(precision, OptimizerKind::sgd);
    o.steps = 3;
    o.export_path = (dir / "first.safetensors").string();
    run_training(o);
    TrainOptions again = tiny_run(precision, OptimizerKind::sgd);
    again.seed = 99;  // other initial weights, all replaced
    again.steps = 1;
    again.schedule.base = 0;
    again.optimizer.weight_decay = 0;
    again.init_from = o.export_path;
    again.export_path = (dir / "second.safetensors").string();
    const TrainReport r = run_training(again);
    EXPECT_TRUE(std::isfinite(r.first_loss));
    const core::SafetensorsFile a(o.export_path), b(again.export_path);
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (const auto& t : a.tensors()) {
      const core::TensorInfo* u = b.find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      const auto x = a.data(t), y = b.data(*u);
      ASSERT_EQ(x.size(), y.size());
      if (t.name.find("running_") != std::string::npos) continue;
      if (t.name.find("num_batches_tracked") != std::string::npos) {
        int64_t n0, n1;
        std::memcpy(&n0, x.data(), 8);
        std::memcpy(&n1, y.data(), 8);
        EXPECT_EQ(n0, 3);
        EXPECT_EQ(n1, 4);
        continue;
      }
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size()), 0) << t.name;
    }
  }
  fs::remove_all(dir);
}
