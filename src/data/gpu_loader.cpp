#include "data/gpu_loader.h"

#include <algorithm>
#include <chrono>

#include "core/device.h"
#include "core/env.h"
#include "core/error.h"
#include "data/file_arena.h"
#include "data/gpu_augment.h"
#include "data/jpeg.h"
#include "data/parallel.h"
#include "data/sampling.h"
#include "data/stall.h"

namespace gpulab::data {

namespace {
// The current device; a clear error, before any CUDA object is made, where there is none.
int checked_device() {
  if (const std::string why = core::why_no_device(); !why.empty())
    throw core::NoDeviceError("the GPU input pipeline needs a CUDA device: " + why);
  int device = 0;
  GPULAB_CHECK(cudaGetDevice(&device));
  return device;
}

// GPULAB_NVJPEG_PINNED=0 reads files into pageable memory, as gpulab did before: an A/B of
// nvJPEG's bitstream uploads (pageable: synchronous, through the driver's staging buffers).
bool pinned_files() { return core::env_switch("GPULAB_NVJPEG_PINNED").value_or(true); }
}  // namespace

struct GpuLoader::Slot {
  explicit Slot(bool pinned) : files(pinned) {}
  core::DeviceBuffer<std::byte> images;
  core::DeviceBuffer<int32_t> labels;
  core::DeviceBuffer<ResizeJob> jobs;
  core::PinnedBuffer<int32_t> host_labels;
  core::PinnedBuffer<ResizeJob> host_jobs;
  FileArena files;  // the batch's files, read by the decoder (nvJPEG's uploads) until `ready`
  // Decoded images, read by the resize kernel until `ready`. One per slot, so a decoder whose
  // writes might not follow stream order (the JPEG engines) never races the previous batch.
  core::DeviceBuffer<uint8_t> decoded;
  core::Event ready{cudaEventDisableTiming};     // loader stream: the batch is written
  core::Event released{cudaEventDisableTiming};  // consumer stream: the batch was read
  GpuBatch batch;
};

GpuLoader::GpuLoader(ImageFolder folder, GpuLoaderOptions opt)
    : folder_(std::move(folder)), opt_(std::move(opt)), device_(checked_device()) {
  if (folder_.samples.empty()) throw core::InputError(folder_.root.string() + ": no images to load");
  if (opt_.batch < 1 || opt_.threads < 1 || opt_.prefetch < 1)
    throw core::InputError("GPU loader: batch, threads and prefetch must be positive");
  const int64_t n = int64_t(folder_.samples.size());
  if (!opt_.train && opt_.shard.world != 1) throw core::InputError("GPU loader: evaluation reads every image, unsharded");
  if (opt_.first_batch < 0) throw core::InputError("GPU loader: first batch must not be negative");
  batches_per_epoch_ = opt_.train ? shard_batches_per_epoch(n, opt_.batch, opt_.shard.world)
                                  : data::batches_per_epoch(n, opt_.batch, false);
  consumed_ = opt_.first_batch;  // batch contents depend on the seed and their number only
  built_ = opt_.first_batch;
  decoder_ = make_batch_decoder(opt_.decode, opt_.threads);
  const bool pinned = pinned_files();
  decoder_name_ = decoder_->name() + (pinned ? "" : " (files in pageable memory: GPULAB_NVJPEG_PINNED=0)");
  const size_t image_elems = size_t(opt_.augment.size) * opt_.augment.size * 3;
  for (int s = 0; s < opt_.prefetch + 1; ++s) {
    auto slot = std::make_unique<Slot>(pinned);
    slot->images = core::DeviceBuffer<std::byte>(image_elems * core::dtype_size(opt_.augment.out) * opt_.batch);
    slot->labels = core::DeviceBuffer<int32_t>(size_t(opt_.batch));
    slot->jobs = core::DeviceBuffer<ResizeJob>(size_t(opt_.batch));
    slot->host_labels = core::PinnedBuffer<int32_t>(size_t(opt_.batch));
    slot->host_jobs = core::PinnedBuffer<ResizeJob>(size_t(opt_.batch));
    slot->batch.images = slot->images.get();
    slot->batch.labels = slot->labels.get();
    slots_.push_back(std::move(slot));
  }
  done_.assign(slots_.size(), 0);
  thread_ = std::thread([this] { produce(); });
}

GpuLoader::~GpuLoader() {
  {
    std::unique_lock lock(mutex_);
    stop_ = true;
    work_cv_.notify_all();
    // A thread stuck inside the decoder cannot be joined: past the stall timeout the process ends.
    wait_or_warn(ready_cv_, lock, [&] { return exited_; }, [&] { return "GPU loader: stopping, but " + where(); });
  }
  thread_.join();
  GPULAB_CHECK_NOTHROW(cudaStreamSynchronize(stream_));
  GPULAB_CHECK_NOTHROW(cudaStreamSynchronize(resize_stream_));
  decoder_.reset();  // nvJPEG's states go before the stream and the buffers their last decode used
}

uint8_t* GpuLoader::decode_area(Slot& slot, size_t bytes, size_t keep) {
  if (slot.decoded.size() < bytes) {
    phase_ = "growing a decode area (cudaMalloc, cudaFree)";
    // Grows rarely (a larger image than any before); the first `keep` bytes are already decoded.
    core::DeviceBuffer<uint8_t> grown(bytes + bytes / 4);
    if (keep) GPULAB_CHECK(cudaMemcpyAsync(grown.get(), slot.decoded.get(), keep, cudaMemcpyDeviceToDevice, stream_));
    stream_.synchronize();
    slot.decoded = std::move(grown);
  }
  return slot.decoded.get();
}

void GpuLoader::build(int64_t b, Slot& slot) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  double read_seconds = 0, decode_seconds = 0;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const int64_t epoch = b / batches_per_epoch_;
  if (epoch != order_epoch_) {
    order_ = epoch_order(int64_t(folder_.samples.size()), opt_.seed, epoch, opt_.train);
    order_epoch_ = epoch;
  }
  const int64_t n = int64_t(order_.size());
  const size_t count = size_t(opt_.batch);
  const int64_t first = shard_position(b % batches_per_epoch_, 0, opt_.batch, opt_.shard);  // slot i: first + i
  std::vector<int64_t> skip(count, 0);  // files of the order skipped for each slot so far
  std::vector<JpegSize> size(count);
  std::vector<const Sample*> sample(count);
  std::vector<size_t> file_at(count), file_bytes(count);  // each slot's file in slot.files (offsets: it may grow)
  auto candidate = [&](size_t i) -> const Sample& {
    return folder_.samples[size_t(order_[size_t((first + int64_t(i) + skip[i]) % n)])];
  };
  auto skip_candidate = [&](size_t i) {  // sample[i] is corrupt: the next file of the order takes its place
    {
      std::lock_guard lock(mutex_);
      corrupt_.insert(sample[i]->path.string());
    }
    if (++skip[i] >= n) throw core::InputError(folder_.root.string() + ": no image in the dataset decodes");
  };
  // Lifetime of the bytes the decoder reads. From pinned memory nvJPEG's uploads are asynchronous:
  // they run on stream_ after decode() returns (BatchDecoder: the bytes stay valid until the
  // stream's work is done). (1) slot.files was last read by this slot's previous batch: its
  // `ready`, which produce() waited for, follows `decoded_`, recorded on stream_ after that batch's
  // last decode, so every upload from it is done and clear() overwrites nothing still read.
  // (2) Within this batch regions are only appended: a replacement is never read into the room of
  // a file already handed to the decoder, whose upload may still be queued (also when its batch
  // failed). (3) A growing arena frees its old buffer only after stream_.synchronize(), when
  // every upload from it is done; stream_ never waits on the consumer, so neither does this.
  slot.files.clear();
  auto idle_decode_stream = [&] {
    phase_ = "growing a file arena (page-locked memory)";
    stream_.synchronize();
  };
  // Reads each of `slots`' next candidate whose header is sound, as the CPU loader's decode would
  // accept, into fresh room in the arena: sizes first, then room for them all, then the reads.
  auto read = [&](std::vector<size_t> slots) {
    while (!slots.empty()) {
      phase_ = "reading and checking files";
      std::vector<size_t> file_size(slots.size());
      parallel_for(int64_t(slots.size()), opt_.threads,
                   [&](int64_t k) { file_size[size_t(k)] = file_size_of(candidate(slots[size_t(k)]).path); });
      const std::vector<size_t> at = slot.files.place(file_size, idle_decode_stream);
      phase_ = "reading and checking files";
      std::vector<char> sound(slots.size(), 0);
      parallel_for(int64_t(slots.size()), opt_.threads, [&](int64_t k) {
        const size_t i = slots[size_t(k)];
        const Sample& s = candidate(i);
        const std::span<uint8_t> to(slot.files.data() + at[size_t(k)], file_size[size_t(k)]);
        read_file_into(s.path, to);
        file_at[i] = at[size_t(k)];
        file_bytes[i] = to.size();
        sample[i] = &s;
        try {
          size[i] = read_jpeg_header(to, s.path.string());
          sound[size_t(k)] = 1;
        } catch (const CorruptImageError&) {  // the next candidate takes its place
        }
      });
      std::vector<size_t> again;
      for (size_t k = 0; k < slots.size(); ++k)
        if (!sound[k]) {
          skip_candidate(slots[k]);
          again.push_back(slots[k]);
        }
      slots = std::move(again);
    }
  };
  std::vector<size_t> all(count);
  for (size_t i = 0; i < count; ++i) all[i] = i;
  read(all);
  read_seconds += since(t0);

  // Decode; a slot whose file fails takes its next candidate, until every slot holds an image.
  std::vector<size_t> offset(count);
  std::vector<size_t> pending = std::move(all);
  size_t used = 0;
  while (!pending.empty()) {
    for (size_t i : pending) {
      offset[i] = used;
      used += (size_t(size[i].width) * size[i].height * 3 + 255) / 256 * 256;  // aligned starts for the decoders
    }
    uint8_t* area = decode_area(slot, used, offset[pending.front()]);
    std::vector<EncodedJpeg> jpegs;
    std::vector<uint8_t*> dst;
    for (size_t i : pending) {
      jpegs.push_back({{slot.files.data() + file_at[i], file_bytes[i]}, size[i].width, size[i].height});
      dst.push_back(area + offset[i]);
    }
    const Clock::time_point t_decode = Clock::now();
    phase_ = "decoding";
    const std::vector<char> ok = decoder_->decode(jpegs, dst, stream_);
    decode_seconds += since(t_decode);
    std::vector<size_t> failed;
    for (size_t k = 0; k < pending.size(); ++k)
      if (!ok[k]) {
        skip_candidate(pending[k]);
        failed.push_back(pending[k]);
      }
    const Clock::time_point t_reread = Clock::now();
    read(failed);
    read_seconds += since(t_reread);
    pending = std::move(failed);
  }

  // The same draws as the CPU loader: generator of the slot's position, dimensions of the file used.
  int skipped = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* src = slot.decoded.get() + offset[i];
    if (opt_.train) {
      Rng rng = augment_rng(opt_.seed, epoch, first + int64_t(i));
      slot.host_jobs.get()[i] = train_job(src, size[i].width, size[i].height,
                                          draw_train(size[i].width, size[i].height, rng, opt_.augment), opt_.augment.size);
    } else {
      slot.host_jobs.get()[i] = eval_job(src, size[i].width, size[i].height, opt_.augment.size);
    }
    check_job(slot.host_jobs.get()[i], opt_.augment.size);
    slot.host_labels.get()[i] = sample[i]->label;
    skipped += int(skip[i]);
  }
  slot.batch.skipped = skipped;
  phase_ = "enqueuing the resize";
  decoded_.record(stream_);
  // The consumer may still read this slot's previous batch: its images and its labels.
  GPULAB_CHECK(cudaStreamWaitEvent(resize_stream_, slot.released.get()));
  GPULAB_CHECK(cudaMemcpyAsync(slot.jobs.get(), slot.host_jobs.get(), count * sizeof(ResizeJob), cudaMemcpyHostToDevice,
                               resize_stream_));
  GPULAB_CHECK(cudaMemcpyAsync(slot.labels.get(), slot.host_labels.get(), count * sizeof(int32_t),
                               cudaMemcpyHostToDevice, resize_stream_));
  GPULAB_CHECK(cudaStreamWaitEvent(resize_stream_, decoded_.get()));
  resized_crop_normalize(slot.jobs.get(), int(count), opt_.augment, slot.images.get(), resize_stream_);
  slot.ready.record(resize_stream_);
  std::lock_guard lock(mutex_);
  decode_stats_ = decoder_->stats();
  ++times_.batches;
  times_.read_seconds += read_seconds;
  times_.decode_seconds += decode_seconds;
  times_.total_seconds += since(t0);
}

void GpuLoader::produce() {
  struct MarkExit {  // however the thread ends, for the destructor's bounded wait
    GpuLoader& l;
    ~MarkExit() {
      {
        std::lock_guard lock(l.mutex_);
        l.exited_ = true;
      }
      l.ready_cv_.notify_all();
    }
  } mark_exit{*this};
  const int64_t ring = int64_t(slots_.size());
  try {
    GPULAB_CHECK(cudaSetDevice(device_));
    for (int64_t b = opt_.first_batch;; ++b) {
      phase_batch_ = b;
      phase_ = "waiting for a free slot";
      {
        std::unique_lock lock(mutex_);
        work_cv_.wait(lock, [&] { return stop_ || b < consumed_ + ring; });
        if (stop_) return;
      }
      Slot& slot = *slots_[size_t(b % ring)];
      phase_ = "waiting for the slot's previous batch on the GPU";
      slot.ready.synchronize();  // its pinned jobs/labels and file bytes were last used by batch b - ring
      build(b, slot);
      phase_ = "handing the batch over";
      {
        std::lock_guard lock(mutex_);
        done_[size_t(b % ring)] = 1;
        built_ = b + 1;
      }
      ready_cv_.notify_all();
    }
  } catch (...) {
    phase_ = "stopped by an error";
    {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
    }
    ready_cv_.notify_all();
  }
}

void GpuLoader::quiesce() {
  const int64_t ring = int64_t(slots_.size());
  {
    std::unique_lock lock(mutex_);
    // Built up to the slot the consumer holds (or will take next): the thread then waits for next().
    wait_or_warn(ready_cv_, lock, [&] { return error_ || built_ >= consumed_ + ring; },
                 [&] { return "GPU loader: waiting for the loader thread to go idle; " + where(); });
  }
  stream_.synchronize();
  resize_stream_.synchronize();
}

const GpuBatch& GpuLoader::next(cudaStream_t consumer) {
  const int64_t ring = int64_t(slots_.size());
  std::unique_lock lock(mutex_);
  if (holding_) {  // release the batch handed out last time, once `consumer` has read it
    const size_t slot = size_t(consumed_ % ring);
    slots_[slot]->released.record(consumer);
    done_[slot] = 0;
    ++consumed_;
    holding_ = false;
    work_cv_.notify_all();
  }
  const size_t slot = size_t(consumed_ % ring);
  wait_or_warn(ready_cv_, lock, [&] { return error_ || done_[slot]; },
               [&] { return "GPU loader: batch " + std::to_string(consumed_) + " not ready; " + where(); });
  if (error_) std::rethrow_exception(error_);
  Slot& s = *slots_[slot];
  GPULAB_CHECK(cudaStreamWaitEvent(consumer, s.ready.get()));
  holding_ = true;
  skipped_total_ += s.batch.skipped;
  s.batch.index = consumed_;
  s.batch.epoch = consumed_ / batches_per_epoch_;
  return s.batch;
}

std::string GpuLoader::where() const {
  return "the GPU loader's thread is at batch " + std::to_string(phase_batch_.load()) + ", " + phase_.load();
}

int64_t GpuLoader::skipped_total() const {
  std::lock_guard lock(mutex_);
  return skipped_total_;
}

GpuLoader::Times GpuLoader::times() const {
  std::lock_guard lock(mutex_);
  return times_;
}

DecodeStats GpuLoader::decode_stats() const {
  std::lock_guard lock(mutex_);
  return decode_stats_;
}

std::vector<std::string> GpuLoader::corrupt_files() const {
  std::lock_guard lock(mutex_);
  return {corrupt_.begin(), corrupt_.end()};
}

}  // namespace gpulab::data
