#include <map>
#include <mutex>

#include "core/error.h"
#include "llm/cpu_model.h"
#include "llm/engine.h"

namespace gpulab::llm {

namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(const WeightSource& weights, int64_t capacity, int threads)
      : model_(weights, threads), capacity_(capacity) {}

  const LlamaConfig& config() const override { return model_.config(); }
  const char* device_name() const override { return "cpu"; }
  int64_t max_batch() const override { return 64; }
  int64_t kv_capacity_tokens() const override { return capacity_; }
  int64_t max_sequence_tokens() const override { return capacity_; }
  int64_t kv_free_tokens() const override {
    std::lock_guard lock(mutex_);
    return capacity_ - reserved_;
  }

  std::optional<SeqId> open(int64_t max_tokens) override {
    std::lock_guard lock(mutex_);
    if (max_tokens > capacity_ - reserved_) return std::nullopt;
    reserved_ += max_tokens;
    const SeqId id = next_id_++;
    sequences_.emplace(id, Sequence{model_.new_cache(), max_tokens});
    return id;
  }

  void close(SeqId seq) override {
    std::lock_guard lock(mutex_);
    auto it = sequences_.find(seq);
    if (it == sequences_.end()) return;
    reserved_ -= it->second.max_tokens;
    sequences_.erase(it);
  }

  void step(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
            std::span<float> logits) override {
    const int64_t vocab = config().vocab_size;
    if (chunks.size() != seqs.size() || logits.size() < seqs.size() * static_cast<size_t>(vocab))
      throw core::Error("CpuEngine::step: sizes of seqs, chunks and logits disagree");
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = sequence(seqs[i]);
      if (s.cache.length + static_cast<int64_t>(chunks[i].size()) > s.max_tokens)
        throw core::Error("CpuEngine::step: sequence grew past the length it reserved");
      const std::vector<float> out = model_.forward(chunks[i], s.cache);
      std::copy(out.end() - vocab, out.end(), logits.begin() + i * vocab);
    }
  }

 private:
  struct Sequence {
    CpuModel::KvCache cache;
    int64_t max_tokens;
  };
  Sequence& sequence(SeqId id) {
    std::lock_guard lock(mutex_);
    auto it = sequences_.find(id);
    if (it == sequences_.end()) throw core::Error("CpuEngine: unknown sequence " + std::to_string(id));
    return it->second;
  }

  CpuModel model_;
  int64_t capacity_;
  mutable std::mutex mutex_;
  int64_t reserved_ = 0;
  SeqId next_id_ = 1;
  std::map<SeqId, Sequence> sequences_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const WeightSource& weights, int64_t kv_capacity_tokens, int threads) {
  return std::make_unique<CpuEngine>(weights, kv_capacity_tokens, threads);
}

}  // namespace gpulab::llm

