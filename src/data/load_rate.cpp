#include "data/load_rate.h"

#include <chrono>

#include "core/error.h"
#include "core/memory.h"
#include "data/folder.h"
#include "data/gpu_loader.h"
#include "data/loader.h"

namespace gpulab::data {

LoadRate measure_load_rate(const std::filesystem::path& dir, const LoadRateOptions& opt) {
  if (opt.pipeline != "cpu" && opt.pipeline != "gpu") throw core::InputError("pipeline must be cpu or gpu");
  if (opt.batches < 1 || opt.warmup < 0) throw core::InputError("batches must be positive");
  ImageFolder folder = scan_image_folder(train_split(dir));
  AugmentSpec spec;
  spec.size = opt.size;
  spec.out = opt.out;
  using Clock = std::chrono::steady_clock;
  LoadRate r;
  Clock::time_point start;
  if (opt.pipeline == "cpu") {
    LoaderOptions lo;
    lo.batch = opt.batch;
    lo.threads = opt.threads;
    lo.seed = opt.seed;
    lo.augment = spec;
    Loader loader(std::move(folder), lo);
    for (int b = 0; b < opt.warmup + opt.batches; ++b) {
      if (b == opt.warmup) start = Clock::now();
      loader.next();
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    r.corrupt_skipped = loader.skipped_total();
  } else {
    GpuLoaderOptions go;
    go.batch = opt.batch;
    go.threads = opt.threads;
    go.seed = opt.seed;
    go.augment = spec;
    go.decode = opt.decode;
    GpuLoader loader(std::move(folder), go);
    core::Stream consumer;  // takes each batch as a trainer would, so batches are released
    for (int b = 0; b < opt.warmup + opt.batches; ++b) {
      if (b == opt.warmup) {
        consumer.synchronize();
        start = Clock::now();
      }
      loader.next(consumer);
    }
    consumer.synchronize();  // the last batch is complete on the GPU
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    r.corrupt_skipped = loader.skipped_total();
    r.decoder = loader.decoder_name();
    r.decode = loader.decode_stats();
    const GpuLoader::Times t = loader.times();
    if (t.batches) {
      r.read_ms = 1e3 * t.read_seconds / double(t.batches);
      r.decode_ms = 1e3 * t.decode_seconds / double(t.batches);
      r.build_ms = 1e3 * t.total_seconds / double(t.batches);
    }
  }
  r.images = int64_t(opt.batches) * opt.batch;
  r.images_per_second = r.seconds > 0 ? double(r.images) / r.seconds : 0;
  return r;
}

}  // namespace gpulab::data
