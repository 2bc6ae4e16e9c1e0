#include "llm/engine.h"

#include "core/error.h"
#include "llm/cpu_model.h"

namespace gpulab::llm {

void Engine::step_greedy(std::span<const SeqId> seqs, std::span<const std::span<const int32_t>> chunks,
                         std::span<int32_t> tokens) {
  if (tokens.size() < seqs.size()) throw core::Error("Engine::step_greedy: fewer token slots than sequences");
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  greedy_logits_.resize(seqs.size() * vocab);
  step(seqs, chunks, greedy_logits_);
  for (size_t i = 0; i < seqs.size(); ++i) tokens[i] = argmax(std::span(greedy_logits_).subspan(i * vocab, vocab));
}

}  // namespace gpulab::llm
