#include "llm/tp_processes.h"

#include <mutex>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"

namespace gpulab::llm {

std::vector<int64_t> encode(const TpMessage& m) {
  std::vector<int64_t> w;
  w.push_back(static_cast<int64_t>(m.calls.size()));
  for (const TpMessage::Call& c : m.calls) {
    w.push_back(c.max_tokens);
    w.push_back(c.seq);
  }
  w.push_back(static_cast<int64_t>(m.kind));
  w.push_back(static_cast<int64_t>(m.chunks.size()));
  for (size_t i = 0; i < m.chunks.size(); ++i) {
    w.push_back(i < m.seqs.size() ? m.seqs[i] : 0);
    w.push_back(static_cast<int64_t>(m.chunks[i].size()));
    w.insert(w.end(), m.chunks[i].begin(), m.chunks[i].end());
  }
  return w;
}

TpMessage decode(std::span<const int64_t> w) {
  size_t at = 0;
  auto next = [&]() -> int64_t {
    if (at >= w.size()) throw core::Error("tensor-parallel message: cut short at word " + std::to_string(at));
    return w[at++];
  };
  TpMessage m;
  const int64_t calls = next();
  if (calls < 0 || static_cast<size_t>(calls) > w.size()) throw core::Error("tensor-parallel message: bad call count");
  for (int64_t i = 0; i < calls; ++i) {
    TpMessage::Call c;
    c.max_tokens = next();
    c.seq = next();
    m.calls.push_back(c);
  }
  const int64_t kind = next();
  if (kind < 1 || kind > 3) throw core::Error("tensor-parallel message: unknown kind " + std::to_string(kind));
  m.kind = static_cast<TpMessage::Kind>(kind);
  const int64_t chunks = next();
  if (chunks < 0 || static_cast<size_t>(chunks) > w.size()) throw core::Error("tensor-parallel message: bad chunk count");
  for (int64_t i = 0; i < chunks; ++i) {
    if (m.kind == TpMessage::Kind::step) m.seqs.push_back(next());
    else next();
    const int64_t len = next();
    if (len < 0 || at + static_cast<size_t>(len) > w.size()) throw core::Error("tensor-parallel message: bad chunk length");
    m.chunks.emplace_back(w.begin() + static_cast<std::ptrdiff_t>(at), w.begin() + static_cast<std::ptrdiff_t>(at + len));
    at += static_cast<size_t>(len);
  }
  if (at != w.size()) throw core::Error("tensor-parallel message: " + std::to_string(w.size() - at) + " words left over");
  return m;
}

namespace {

// Messages from rank 0 to all: the length, then the words, each an ncclBroadcast, waited for
// before the call they carry issues its own collectives on the same communicator.
class Channel {
 public:
  explicit Channel(ncclComm_t comm) : comm_(comm), length_(1) {}

  // Rank 0: `words` out; the others: `words` replaced by rank 0's.
  void broadcast(std::vector<int64_t>& words) {
    int64_t n = static_cast<int64_t>(words.size());
    GPULAB_CHECK(cudaMemcpyAsync(length_.get(), &n, 8, cudaMemcpyHostToDevice, stream_));
    GPULAB_CHECK(ncclBroadcast(length_.get(), length_.get(), 1, ncclInt64, 0, comm_, stream_));
    GPULAB_CHECK(cudaMemcpyAsync(&n, length_.get(), 8, cudaMemcpyDeviceToHost, stream_));
    stream_.synchronize();
    words.resize(n);
    if (n == 0) return;
    if (words_.size() < static_cast<size_t>(n)) words_ = core::DeviceBuffer<int64_t>(n);
    GPULAB_CHECK(cudaMemcpyAsync(words_.get(), words.data(), n * 8, cudaMemcpyHostToDevice, stream_));
    GPULAB_CHECK(ncclBroadcast(words_.get(), words_.get(), n, ncclInt64, 0, comm_, stream_));
    GPULAB_CHECK(cudaMemcpyAsync(words.data(), words_.get(), n * 8, cudaMemcpyDeviceToHost, stream_));
    stream_.synchronize();
  }

 private:
  ncclComm_t comm_;
  core::Stream stream_;
  core::DeviceBuffer<int64_t> length_, words_;
};

// A follower's replay of the opens and closes: its engine must hand out the leader's ids.
void replay(CudaEngine& engine, const std::vector<TpMessage::Call>& calls) {
  for (const TpMessage::Call& c : calls) {
    if (c.max_tokens == 0) {
      engine.close(c.seq);
      continue;
    }
    const std::optional<SeqId> id = engine.open(c.max_tokens);
    if (id != c.seq)
      throw core::Error("tensor-parallel follower: opened sequence " + (id ? std::to_string(*id) : "none") +
                        " where the leader got " + std::to_string(c.seq));
  }
}

}  // namespace

struct LeaderEngine::Impl {
  std::unique_ptr<CudaEngine> engine;
  std::unique_ptr<Channel> channel;
  std::mutex mutex;  // open and close may come from another thread than step
  std::vector<TpMessage::Call> calls;  // since the last message

  // Sends `m` with the calls made since the last message.
  void send(TpMessage m) {
    {
      std::lock_guard lock(mutex);
      m.calls.swap(calls);
    }
    std::vector<int64_t> words = encode(m);
    channel->broadcast(words);
  }
};

LeaderEngine::LeaderEngine(const WeightSource& weights, const EngineOptions& options)
    : impl_(std::make_unique<Impl>()) {
  if (options.shard.rank != 0 || !options.comm)
    throw core::Error("LeaderEngine: needs rank 0 of a tensor-parallel group and its communicator");
  impl_->engine = std::make_unique<CudaEngine>(weights, options);
  impl_->channel = std::make_unique<Channel>(options.comm);
}

LeaderEngine::~LeaderEngine() {
  try {
    impl_->send({});  // kind stop
  } catch (const std::exception& e) {
    core::log_error("tensor-parallel leader: could not stop the followers: ", e.what());
  }
}

const LlamaConfig& LeaderEngine::config() const { return impl_->engine->config(); }
int64_t LeaderEngine::max_batch() const { return impl_->engine->max_batch(); }
int64_t LeaderEngine::kv_capacity_tokens() const { return impl_->engine->kv_capacity_tokens(); }
int64_t LeaderEngine::kv_free_tokens() const { return impl_->engine->kv_free_tokens(); }
int64_t LeaderEngine::max_sequence_tokens() const { return impl_->engine->max_sequence_tokens(); }

std::optional<SeqId> LeaderEngine::open(int64_t max_tokens) {
  std::lock_guard lock(impl_->mutex);
  const std::optional<SeqId> id = impl_->engine->open(max_tokens);
  if (id) impl_->calls.push_back({max_tokens, *id});
  return id;
}

void LeaderEngine::close(SeqId seq) {
  std::lock_guard lock(impl_->mutex);
  impl_->engine->close(seq);
  impl_->calls.push_back({0, seq});
}

void LeaderEngine::step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
                        std::span<float> logits) {
  TpMessage m;
  m.kind = TpMessage::Kind::step;
  m.seqs.assign(seqs.begin(), seqs.end());
  for (const auto& c : chunks) m.chunks.emplace_back(c.begin(), c.end());
  impl_->send(std::move(m));
  impl_->engine->step(seqs, chunks, logits);
}

std::vector<float> LeaderEngine::logits(std::span<const int32_t> ids) {
  TpMessage m;
  m.kind = TpMessage::Kind::logits;
  m.chunks.emplace_back(ids.begin(), ids.end());
  impl_->send(std::move(m));
  return impl_->engine->logits(ids);
}

void follow_leader(const WeightSource& weights, const EngineOptions& options) {
  if (options.shard.rank == 0 || !options.comm)
    throw core::Error("follow_leader: needs a rank other than 0 of a tensor-parallel group and its communicator");
  CudaEngine engine(weights, options);
  Channel channel(options.comm);
  for (;;) {
    std::vector<int64_t> words;
    channel.broadcast(words);
    const TpMessage m = decode(words);
    replay(engine, m.calls);
    try {
      if (m.kind == TpMessage::Kind::stop) return;
      std::vector<std::span<const int32_t>> chunks(m.chunks.begin(), m.chunks.end());
      if (m.kind == TpMessage::Kind::step) engine.step(m.seqs, chunks, {});
      if (m.kind == TpMessage::Kind::logits) engine.logits(chunks.at(0));
    } catch (const core::InputError&) {
      // The leader's engine refuses the same call the same way, before any collective.
    }
  }
}

}  // namespace gpulab::llm
