#include "llm/tp_engine.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"

namespace gpulab::llm {

std::vector<int> tp_devices(int tp) {
  if (tp < 1) throw core::InputError("--tp must be at least 1, not " + std::to_string(tp));
  const int visible = core::require_devices();
  if (tp > visible)
    throw core::InputError("--tp " + std::to_string(tp) + " needs " + std::to_string(tp) + " GPUs, but " +
                           std::to_string(visible) + (visible == 1 ? " is" : " are") +
                           " visible (check CUDA_VISIBLE_DEVICES, or lower --tp)");
  std::vector<int> devices(tp);
  for (int r = 0; r < tp; ++r) devices[r] = r;
  return devices;
}

// One thread per rank, each bound to its GPU for good; run() hands every thread the same job
// and waits for all of them, since a rank's collectives complete only when all ranks run theirs.
struct TpEngine::Impl {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<std::unique_ptr<CudaEngine>> ranks;
  std::mutex open_mutex;  // ranks must see open and close in one order

  std::vector<std::thread> threads;
  std::mutex run_mutex;  // one job at a time (step and logits may come from different threads)
  std::mutex mutex;
  std::condition_variable wake, done;
  std::function<void(int)> job;
  uint64_t generation = 0;
  int pending = 0;
  bool stopping = false;
  bool broken = false;       // a rank failed past a user error: the communicators are gone
  std::exception_ptr error;  // the first rank's failure of the current job

  int world() const { return static_cast<int>(devices.size()); }

  void start() {
    for (int r = 0; r < world(); ++r) threads.emplace_back([this, r] { worker(r); });
  }

  void worker(int rank) {
    uint64_t seen = 0;
    const cudaError_t set = cudaSetDevice(devices[rank]);
    for (;;) {
      std::unique_lock lock(mutex);
      wake.wait(lock, [&] { return stopping || generation != seen; });
      if (stopping) return;
      seen = generation;
      lock.unlock();
      std::exception_ptr failure;
      bool fatal = false;  // a user error is found by every rank alike, before any collective
      try {
        GPULAB_CHECK(set);
        job(rank);
      } catch (const core::InputError&) {
        failure = std::current_exception();
      } catch (...) {
        failure = std::current_exception();
        fatal = true;
      }
      lock.lock();
      if (failure && !error) error = failure;
      if (fatal && !broken) {
        // The other ranks may wait in a collective for this one: aborting frees them.
        for (ncclComm_t c : comms) GPULAB_CHECK_NOTHROW(ncclCommAbort(c));
        comms.clear();
        broken = true;
      }
      if (--pending == 0) done.notify_all();
    }
  }

  // Runs fn(rank) on every rank's thread at once; rethrows the first failure.
  void run(std::function<void(int)> fn, bool teardown = false) {
    std::lock_guard one_job(run_mutex);
    std::unique_lock lock(mutex);
    if (broken && !teardown) throw core::Error("the tensor-parallel engine stopped after a rank failed");
    job = std::move(fn);
    error = nullptr;
    pending = world();
    ++generation;
    wake.notify_all();
    done.wait(lock, [&] { return pending == 0; });
    if (error) std::rethrow_exception(error);
  }

  void stop() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    for (auto& t : threads) t.join();
  }

  ~Impl() {
    if (threads.empty()) return;
    // Engines and communicators are torn down on their own GPU's thread, all ranks together
    // (destroying a communicator finalizes it with its peers).
    const std::vector<ncclComm_t> live = comms;
    try {
      run([&](int r) {
        if (live.empty() && ranks[r]) ranks[r]->communicator_aborted();
        ranks[r].reset();
        if (!live.empty()) GPULAB_CHECK_NOTHROW(ncclCommDestroy(live[r]));
      }, true);
    } catch (const std::exception& e) {  // a rank thread that could not select its GPU
      core::log_error("tensor-parallel engine teardown: ", e.what());
    }
    stop();
  }
};

TpEngine::TpEngine(const WeightSource& weights, const EngineOptions& options, std::vector<int> devices)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const int visible = core::require_devices();
  if (devices.empty()) throw core::InputError("tensor parallel needs at least one GPU");
  for (int d : devices)
    if (d < 0 || d >= visible)
      throw core::InputError("GPU " + std::to_string(d) + " is not visible (" + std::to_string(visible) + " are)");
  m.devices = std::move(devices);
  shard_layout(weights.config(), {0, m.world()});  // a model that does not split fails here, before NCCL
  // NVLink SHARP multicast stays off unless the user set it: these machines must not create
  // multicast objects.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  m.comms.resize(m.world());
  GPULAB_CHECK(ncclCommInitAll(m.comms.data(), m.world(), m.devices.data()));
  m.ranks.resize(m.world());
  m.start();
  m.run([&](int r) {
    EngineOptions o = options;
    o.shard = {r, m.world()};
    o.comm = m.comms[r];
    m.ranks[r] = std::make_unique<CudaEngine>(weights, o);
  });
}

TpEngine::~TpEngine() = default;

const LlamaConfig& TpEngine::config() const { return impl_->ranks[0]->config(); }
int TpEngine::world() const { return impl_->world(); }
int64_t TpEngine::max_batch() const { return impl_->ranks[0]->max_batch(); }
int64_t TpEngine::kv_capacity_tokens() const { return impl_->ranks[0]->kv_capacity_tokens(); }
int64_t TpEngine::kv_free_tokens() const { return impl_->ranks[0]->kv_free_tokens(); }
int64_t TpEngine::max_sequence_tokens() const { return impl_->ranks[0]->max_sequence_tokens(); }
CudaEngine::Capacity TpEngine::capacity() const { return impl_->ranks[0]->capacity(); }

// Every rank has the same pool and sees the same calls, so each hands out the same id and pages.
std::optional<SeqId> TpEngine::open(int64_t max_tokens) {
  std::lock_guard lock(impl_->open_mutex);
  const std::optional<SeqId> id = impl_->ranks[0]->open(max_tokens);
  for (size_t r = 1; r < impl_->ranks.size(); ++r)
    if (impl_->ranks[r]->open(max_tokens) != id)
      throw core::Error("tensor-parallel ranks disagree on their KV pages (rank " + std::to_string(r) + ")");
  return id;
}

void TpEngine::close(SeqId seq) {
  std::lock_guard lock(impl_->open_mutex);
  for (auto& rank : impl_->ranks) rank->close(seq);
}

void TpEngine::step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
                    std::span<float> logits) {
  impl_->run([&](int r) { impl_->ranks[r]->step(seqs, chunks, r == 0 ? logits : std::span<float>{}); });
}

std::vector<float> TpEngine::logits(std::span<const int32_t> ids) {
  std::vector<float> out;
  impl_->run([&](int r) {
    std::vector<float> mine = impl_->ranks[r]->logits(ids);
    if (r == 0) out = std::move(mine);
  });
  return out;
}

}  // namespace gpulab::llm
