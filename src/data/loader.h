// A multi-threaded CPU loader over an ImageFolder: seeded shuffle per epoch, JPEG decode and
// augmentation on N threads, `prefetch` batches in flight. The bytes of every batch depend only
// on the seed, never on the thread count. A corrupt file is skipped (the next file of the
// epoch's order takes its place) and counted.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/augment.h"
#include "data/folder.h"
#include "data/shard.h"

namespace gpulab::data {

struct LoaderOptions {
  int batch = 256;
  int threads = 4;
  int prefetch = 2;  // batches being filled while the consumer holds one
  uint64_t seed = 0;
  bool train = true;  // false: file order, eval transform
  int64_t first_batch = 0;  // global batch number to start at (a resumed run's position)
  Shard shard;        // train: this rank's share of each epoch (data/shard.h)
  AugmentSpec augment;
};

struct Batch {
  int64_t index = 0;  // global batch number, counting across epochs
  int64_t epoch = 0;
  std::vector<std::byte> images;  // batch x size x size x 3 in augment.out's type (NHWC)
  std::vector<int32_t> labels;
  int skipped = 0;  // corrupt files replaced in this batch
};

class Loader {
 public:
  Loader(ImageFolder folder, LoaderOptions opt);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch; valid until the following call. Rethrows a worker's failure.
  const Batch& next();
  // Batches per epoch. train: this rank's full batches only (floor); eval: every image once (ceil), the
  // last batch filled up by wrapping to the epoch's first images, which the caller ignores.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t skipped_total() const;  // corrupt files skipped in the batches handed out so far
  std::vector<std::string> corrupt_files() const;
  const ImageFolder& folder() const { return folder_; }

 private:
  void work();
  void fill(int64_t batch, int slot_in_batch, Batch& out);
  std::shared_ptr<const std::vector<int64_t>> order(int64_t epoch);

  ImageFolder folder_;
  LoaderOptions opt_;
  int64_t batches_per_epoch_;
  size_t image_bytes_;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_, ready_cv_;
  std::vector<Batch> slots_;
  std::vector<int> done_;
  int64_t next_job_ = 0;
  int64_t consumed_ = 0;  // batches released back to the workers
  bool holding_ = false;  // the consumer holds batch consumed_
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t skipped_total_ = 0;
  std::set<std::string> corrupt_;
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;
  std::vector<std::thread> threads_;
};

}  // namespace gpulab::data
