// The GPU data pipeline: files are read and their headers checked on CPU threads, decoded by a
// BatchDecoder (nvJPEG's hardware engines where present), then cropped, resized, flipped and
// normalized by one CUDA kernel, on the loader's own streams, `prefetch` batches ahead of the
// consumer. Order, crops and flips come from sampling.h, so for one seed the GPU loader hands out
// the same images, labels and crops as the CPU Loader (pixels within decoder and float rounding).
// A corrupt file is skipped (the next file of the epoch's order takes its place) and counted.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/memory.h"
#include "data/augment.h"
#include "data/folder.h"
#include "data/gpu_decode.h"
#include "data/shard.h"

namespace gpulab::data {

struct GpuLoaderOptions {
  int batch = 256;
  int threads = 4;   // CPU threads reading files (and decoding, with the TurboJPEG decoder)
  int prefetch = 2;  // batches prepared while the consumer holds one
  uint64_t seed = 0;
  bool train = true;  // false: file order, eval transform
  AugmentSpec augment;
  DecodeBackend decode = DecodeBackend::automatic;
  Shard shard;              // train: this rank's share of each epoch, as the CPU loader's
  int64_t first_batch = 0;  // global batch number to start at (a resumed run's position)
};

struct GpuBatch {
  int64_t index = 0;  // global batch number, counting across epochs
  int64_t epoch = 0;
  const std::byte* images = nullptr;  // device: batch x size x size x 3 in augment.out's type (NHWC)
  const int32_t* labels = nullptr;    // device
  int skipped = 0;                    // corrupt files replaced in this batch
};

class GpuLoader {
 public:
  // Needs a CUDA device (the current one).
  GpuLoader(ImageFolder folder, GpuLoaderOptions opt);
  ~GpuLoader();
  GpuLoader(const GpuLoader&) = delete;
  GpuLoader& operator=(const GpuLoader&) = delete;

  // The next batch, ready for work enqueued on `consumer` after this call. It stays valid until
  // the next call, which also marks on `consumer` when the GPU has finished reading it: enqueue
  // every use of the batch on `consumer` before calling again. Rethrows the loader's failure; a
  // loader that delivers nothing for the stall timeout ends the process (data/stall.h).
  const GpuBatch& next(cudaStream_t consumer);
  // Returns once the loader thread has filled every free slot and its stream is idle: until the
  // next call of next() it makes no CUDA call, so another thread may capture a CUDA graph
  // (a context-wide synchronization in the loader, such as a cudaFree or nvJPEG's own, would
  // break the capture) on an idle device.
  void quiesce();
  // Where the loader thread stands, for stall messages (any thread): "the GPU loader's thread is at batch 74, decoding".
  std::string where() const;
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t skipped_total() const;  // corrupt files skipped in the batches handed out so far
  std::vector<std::string> corrupt_files() const;
  std::string decoder_name() const { return decoder_name_; }
  DecodeStats decode_stats() const;
  // Where the loader thread's time went, summed over the batches built so far: reading and
  // checking files on the CPU threads, and inside the decoder's calls (host wall time, which
  // includes any waiting the decoder does for the GPU or the JPEG engines).
  struct Times {
    int64_t batches = 0;
    double read_seconds = 0, decode_seconds = 0, total_seconds = 0;
  };
  Times times() const;

 private:
  struct Slot;
  void produce();
  void build(int64_t batch, Slot& slot);
  uint8_t* decode_area(Slot& slot, size_t bytes, size_t keep);

  ImageFolder folder_;
  GpuLoaderOptions opt_;
  int64_t batches_per_epoch_;
  int device_;  // before every CUDA member: checks for a device first
  std::unique_ptr<BatchDecoder> decoder_;
  std::string decoder_name_;

  // Producer-only state: the loader's streams (quiesce() also waits for them) and the current
  // epoch's order. Decoding has a stream of its own that never waits on the consumer: the decoder's
  // own host synchronizations (nvJPEG's, TurboJPEG's staging) then wait for decode work only, never
  // for a training step queued behind a release event, and a batch decodes while the consumer
  // still holds the slot. The resize stream waits for the decode and for the slot's release. Both
  // have high priority so the loader's kernels are not queued behind a training step's.
  core::Stream stream_{core::StreamPriority::high};  // decode
  core::Stream resize_stream_{core::StreamPriority::high};
  core::Event decoded_{cudaEventDisableTiming};  // stream_: the batch being built is decoded
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_, ready_cv_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<char> done_;
  int64_t built_ = 0;  // batches before this one are built (done_)
  int64_t consumed_ = 0;
  bool holding_ = false;
  bool stop_ = false;
  bool exited_ = false;  // the loader thread has left produce()
  std::exception_ptr error_;
  int64_t skipped_total_ = 0;
  std::set<std::string> corrupt_;
  DecodeStats decode_stats_;
  Times times_;
  // What the loader thread is doing, for the consumer's stall warning (data/stall.h).
  std::atomic<const char*> phase_{"starting"};
  std::atomic<int64_t> phase_batch_{0};
  std::thread thread_;
};

}  // namespace gpulab::data
