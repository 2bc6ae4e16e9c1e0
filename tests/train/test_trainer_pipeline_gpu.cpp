// `gpulab train --pipeline gpu` end to end: the GPU loader feeds the network, learns the `shapes`
// task as the CPU loader does, skips a corrupt file, starts from the CPU pipeline's inputs, and
// runs in several processes on one GPU at once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/gpu.h"
#include "common/run_command.h"
#include "common/temp_dir.h"
#include "data/dataset.h"
#include "train/trainer.h"
#include "train/train_test_util.h"

using namespace gpulab;
using namespace gpulab::train;

namespace {

// The `shapes` task at 96x72: 6 classes of 40 training images, and `val_images` each to validate.
void make_shapes(const std::filesystem::path& dir, int val_images) {
  data::MakeOptions mo;
  mo.classes = 6;
  mo.train_images = 40;
  mo.val_images = val_images;
  mo.width = 96;
  mo.height = 72;
  mo.seed = 4;
  mo.threads = 8;
  data::make_dataset(dir, mo);
}

}  // namespace

TEST(TrainerPipelineGpu, GpuPipelineLearnsShapesAndSkipsACorruptFile) {
  GPULAB_REQUIRE_GPU();
  gpulab::testing::TempDir dir("train_gpu_pipeline");
  make_shapes(dir.path, 10);
  const auto victim = dir.path / "train" / "c0002_red_triangle" / "img_000007.JPEG";
  std::ofstream(victim, std::ios::trunc) << "corrupt";

  TrainOptions o;
  o.data = dir.path.string();
  o.pipeline = "gpu";
  o.depth = 18;
  o.width = fixtures::test_width();
  o.image_size = 64;
  o.batch = 24;
  // Under racecheck 12 steps, every file read once, and the learning is not judged, as in the
  // CPU-loader test of the same task (test_trainer_gpu.cpp).
  o.steps = under_racecheck() ? 12 : 150;
  o.warmup_steps_untimed = 2;
  o.schedule.base = 0.02;  // as that test
  o.schedule.warmup = 10;
  o.precision = "bf16";
  o.eval = true;
  std::vector<float> losses;
  const TrainReport r = run_training(o, [&](const StepReport& s) { losses.push_back(s.loss); });
  std::printf("GPU pipeline decoder: %s\n", r.decoder.c_str());
  EXPECT_FALSE(r.decoder.empty());
  EXPECT_GE(r.corrupt_skipped, 1);
  ASSERT_EQ(r.corrupt_files.size(), 1u);
  EXPECT_EQ(r.corrupt_files[0], victim.string());
  ASSERT_EQ(losses.size(), size_t(o.steps));
  if (under_racecheck()) return;
  double tail = 0;
  for (size_t i = losses.size() - 10; i < losses.size(); ++i) tail += losses[i] / 10;
  std::printf("GPU pipeline shapes: last-10 loss %.3f, validation top-1 %.1f%%\n", tail, 100 * r.val_top1);
  EXPECT_LT(tail, 0.8 * std::log(6.0));  // chance is ln 6 whatever the smoothing
  EXPECT_GT(r.val_top1, 0.4);            // chance is 1/6
}

TEST(TrainerPipelineGpu, FirstStepLossAgreesWithTheCpuPipeline) {
  // Same seed: same images, labels and crops; pixels differ only by the JPEG decoder, so the
  // first loss (before any update) agrees closely. A wrong crop, flip or label order does not.
  GPULAB_REQUIRE_GPU();
  gpulab::testing::TempDir dir("train_gpu_pipeline_loss");
  data::MakeOptions mo;
  mo.classes = 8;
  mo.train_images = 8;
  mo.val_images = 1;
  mo.width = 160;
  mo.height = 120;
  mo.threads = 8;
  data::make_dataset(dir.path, mo);
  float first[2] = {0, 0};
  for (int gpu = 0; gpu < 2; ++gpu) {
    TrainOptions o;
    o.data = dir.path.string();
    o.pipeline = gpu ? "gpu" : "cpu";
    o.depth = 18;
    o.image_size = 64;
    o.batch = 32;
    o.steps = 1;
    o.seed = 11;
    o.label_smoothing = 0;
    run_training(o, [&](const StepReport& s) { first[gpu] = s.loss; });
  }
  std::printf("first-step loss: cpu pipeline %.6f, gpu pipeline %.6f\n", first[0], first[1]);
  ASSERT_TRUE(std::isfinite(first[1]));
  EXPECT_NEAR(first[1], first[0], 5e-3 * std::abs(first[0]));
}

// Training processes that decode on one GPU's JPEG engines at once all finish. Before the decoders
// took turns (EngineLock, src/data/nvjpeg_decoder.cpp), three processes of this file's tests hung
// in nvJPEG's hardware decode in every round (session 24); processes that only load batches, with
// no training beside them, did not. Each run is bounded by timeout(1), so a hang fails the test
// as exit 124 instead of stopping it.
TEST(TrainerPipelineGpu, ProcessesSharingTheJpegEnginesAllFinish) {
  GPULAB_REQUIRE_GPU();
  gpulab::testing::TempDir dir("train_gpu_pipeline_processes");
  make_shapes(dir.path, 1);
  constexpr int kProcesses = 3;
  // The three children run at once, under a sanitizer too (which then checks each child). There they
  // sat at batch 0 in sessions 32-35; they finish since run_command hands them none of this
  // process's descriptors (docs/reliability.md, sessions 36-37). Under a sanitizer each child trains
  // 10 steps in 110 s at most; under racecheck, where none of the three had printed a line after
  // 110 s (session 38), 3 steps in 420 s. The limits fit inside compute_sanitizer.sh's --timeout
  // and a device call's deadline, so a run that outlasts them still ends here and prints how far
  // each child got.
  const bool sanitized = !sanitizer_tool().empty();
  const int steps = under_racecheck() ? 3 : sanitized ? 10 : 150;
  const int limit_s = under_racecheck() ? 420 : sanitized ? 110 : 90;
  std::string script;
  for (int p = 0; p < kProcesses; ++p) {
    const std::string out = (dir.path / ("out" + std::to_string(p))).string();
    script += "(timeout " + std::to_string(limit_s) + " " + GPULAB_EXE + " train --data " + dir.path.string() +
              " --pipeline gpu --depth 18 --image-size 64 --batch 24 --steps " + std::to_string(steps) +
              " --precision bf16 --log-every 1 > " + out + " 2>&1; echo $? > " + out + ".rc) & ";
  }
  gpulab::testing::run_command(script + "wait");
  for (int p = 0; p < kProcesses; ++p) {
    const std::string out = (dir.path / ("out" + std::to_string(p))).string();
    std::ifstream rc_file(out + ".rc"), out_file(out);
    int rc = -1;
    rc_file >> rc;
    const std::string text((std::istreambuf_iterator<char>(out_file)), std::istreambuf_iterator<char>());
    EXPECT_EQ(rc, 0) << "process " << p << " (124: still running after " << limit_s << " s):\n" << text;
    // --log-every 1: a line per step, so a child cut short shows how far it got.
    const std::string last = "step " + std::to_string(steps) + "/" + std::to_string(steps) + " ";
    EXPECT_NE(text.find(last), std::string::npos) << "process " << p << ":\n" << text;
  }
}
