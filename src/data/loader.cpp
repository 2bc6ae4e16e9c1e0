#include "data/loader.h"

#include <algorithm>

#include "core/error.h"
#include "data/sampling.h"
#include "data/stall.h"

namespace gpulab::data {

Loader::Loader(ImageFolder folder, LoaderOptions opt) : folder_(std::move(folder)), opt_(std::move(opt)) {
  if (folder_.samples.empty()) throw core::InputError(folder_.root.string() + ": no images to load");
  if (opt_.batch < 1 || opt_.threads < 1 || opt_.prefetch < 1) throw core::InputError("loader: batch, threads and prefetch must be positive");
  const int64_t n = int64_t(folder_.samples.size());
  if (!opt_.train && opt_.shard.world != 1) throw core::InputError("loader: evaluation reads every image, unsharded");
  batches_per_epoch_ = opt_.train ? shard_batches_per_epoch(n, opt_.batch, opt_.shard.world)
                                  : data::batches_per_epoch(n, opt_.batch, false);
  image_bytes_ = size_t(opt_.augment.size) * opt_.augment.size * 3 * core::dtype_size(opt_.augment.out);
  slots_.resize(opt_.prefetch + 1);
  done_.assign(slots_.size(), 0);
  for (auto& s : slots_) {
    s.images.resize(image_bytes_ * opt_.batch);
    s.labels.resize(opt_.batch);
  }
  if (opt_.first_batch < 0) throw core::InputError("loader: first batch must not be negative");
  consumed_ = opt_.first_batch;  // batch contents depend on the seed and their number only
  next_job_ = opt_.first_batch * opt_.batch;
  for (int t = 0; t < opt_.threads; ++t) threads_.emplace_back([this] { work(); });
}

Loader::~Loader() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

std::shared_ptr<const std::vector<int64_t>> Loader::order(int64_t epoch) {
  std::lock_guard lock(mutex_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  auto perm = std::make_shared<const std::vector<int64_t>>(
      epoch_order(int64_t(folder_.samples.size()), opt_.seed, epoch, opt_.train));
  // Workers touch at most two epochs at once; older orders are done with.
  while (!orders_.empty() && orders_.begin()->first < epoch - 1) orders_.erase(orders_.begin());
  return orders_[epoch] = perm;
}

void Loader::fill(int64_t batch, int slot_in_batch, Batch& out) {
  const int64_t epoch = batch / batches_per_epoch_;
  const auto perm = order(epoch);
  const int64_t n = int64_t(perm->size());
  const int64_t position = shard_position(batch % batches_per_epoch_, slot_in_batch, opt_.batch, opt_.shard);
  std::byte* dst = out.images.data() + image_bytes_ * slot_in_batch;
  for (int64_t k = 0; k < n; ++k) {
    const Sample& s = folder_.samples[(*perm)[(position + k) % n]];
    try {
      const Image img = read_jpeg(s.path);
      if (opt_.train) {
        Rng rng = augment_rng(opt_.seed, epoch, position);
        augment_train(img, rng, opt_.augment, dst);
      } else {
        augment_eval(img, opt_.augment, dst);
      }
      out.labels[slot_in_batch] = s.label;
      if (k) {
        std::lock_guard lock(mutex_);
        out.skipped += int(k);
      }
      return;
    } catch (const CorruptImageError&) {
      std::lock_guard lock(mutex_);
      corrupt_.insert(s.path.string());
    }
  }
  throw core::InputError(folder_.root.string() + ": no image in the dataset decodes");
}

void Loader::work() {
  const int64_t ring = int64_t(slots_.size());
  for (;;) {
    int64_t job;
    {
      std::unique_lock lock(mutex_);
      // A batch may be filled once its slot's previous batch was released.
      work_cv_.wait(lock, [&] { return stop_ || next_job_ / opt_.batch < consumed_ + ring; });
      if (stop_) return;
      job = next_job_++;
    }
    const int64_t b = job / opt_.batch;
    Batch& out = slots_[b % ring];
    try {
      fill(b, int(job % opt_.batch), out);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      ++done_[b % ring];
    }
    ready_cv_.notify_all();
  }
}

const Batch& Loader::next() {
  const int64_t ring = int64_t(slots_.size());
  std::unique_lock lock(mutex_);
  if (holding_) {  // release the batch handed out last time
    const int64_t slot = consumed_ % ring;
    done_[slot] = 0;
    slots_[slot].skipped = 0;
    ++consumed_;
    holding_ = false;
    work_cv_.notify_all();
  }
  const int64_t slot = consumed_ % ring;
  wait_or_warn(ready_cv_, lock, [&] { return error_ || done_[slot] == opt_.batch; }, [&] {
    return "loader: batch " + std::to_string(consumed_) + " has " + std::to_string(done_[slot]) + " of " +
           std::to_string(opt_.batch) + " images";
  });
  if (error_) std::rethrow_exception(error_);
  holding_ = true;
  Batch& b = slots_[slot];
  // Counted when handed out, not when filled: workers run ahead into batches not yet delivered.
  skipped_total_ += b.skipped;
  b.index = consumed_;
  b.epoch = consumed_ / batches_per_epoch_;
  return b;
}

int64_t Loader::skipped_total() const {
  std::lock_guard lock(mutex_);
  return skipped_total_;
}

std::vector<std::string> Loader::corrupt_files() const {
  std::lock_guard lock(mutex_);
  return {corrupt_.begin(), corrupt_.end()};
}

}  // namespace gpulab::data
