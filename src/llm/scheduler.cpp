#include "llm/scheduler.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "kernels/ref_parallel.h"

namespace gpulab::llm {

using Clock = std::chrono::steady_clock;

struct Scheduler::Active {
  GenerationRequest request;
  Sampler sampler;
  SeqId seq = -1;
  int64_t prompt_fed = 0;        // prompt tokens already in the KV cache
  std::vector<int32_t> generated;
  std::string text;              // the generated text so far (decoded a few tokens at a time)
  Tokenizer::StreamState text_state;
  size_t text_emitted = 0;       // bytes of `text` already passed to on_text
  GenerationResult result;
  Clock::time_point submitted = Clock::now();
  bool done = false;

  explicit Active(GenerationRequest r) : request(std::move(r)), sampler(request.sampling) {}
  bool prefilling() const { return prompt_fed < static_cast<int64_t>(request.prompt.size()); }
};

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: those
// bytes may yet become a stop string, so they are held back from the stream.
size_t stop_prefix_suffix(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return hold;
}

}  // namespace

Scheduler::Scheduler(Engine& engine, const Tokenizer& tokenizer, SchedulerOptions options)
    : Scheduler(engine, options) {
  tokenizer_ = &tokenizer;
}

Scheduler::Scheduler(Engine& engine, SchedulerOptions options)
    : engine_(engine), tokenizer_(nullptr), options_(options) {
  if (options_.max_batch < 1 || options_.prefill_chunk < 1 || options_.step_prefill_tokens < 1)
    throw core::InputError("max batch, prefill chunk and step prefill tokens must be at least 1");
  options_.max_batch = std::min(options_.max_batch, engine.max_batch());
  if (options_.sampling_threads <= 0)
    options_.sampling_threads = std::clamp(int(std::thread::hardware_concurrency()) / 2, 1, 8);
}

Scheduler::~Scheduler() {
  stop();
  std::lock_guard lock(mutex_);
  for (auto& a : running_) finish(*a, "cancelled");
  for (auto& a : waiting_) finish(*a, "cancelled");
}

void Scheduler::submit(GenerationRequest request) {
  const auto& cfg = engine_.config();
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  if (prompt == 0) throw core::InputError("the prompt is empty");
  if (request.max_new_tokens < 1) throw core::InputError("max_tokens must be at least 1");
  // Capped so that the sum cannot overflow; any cap beyond every context gives the same verdicts.
  const int64_t total = prompt + std::min<int64_t>(request.max_new_tokens, int64_t{1} << 62);
  if (cfg.max_position_embeddings > 0 && total > cfg.max_position_embeddings)
    throw core::InputError("prompt (" + std::to_string(prompt) + " tokens) plus max_tokens (" +
                           std::to_string(request.max_new_tokens) + ") exceeds the model's context of " +
                           std::to_string(cfg.max_position_embeddings) + " tokens");
  if (total > engine_.max_sequence_tokens())
    throw core::InputError("prompt plus max_tokens (" + std::to_string(total) + " tokens) exceeds the KV cache one sequence may hold (" +
                           std::to_string(engine_.max_sequence_tokens()) + " tokens)");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= cfg.vocab_size) throw core::InputError("token id " + std::to_string(id) + " is outside the vocabulary");
  for (const auto& s : request.stop)
    if (s.empty()) throw core::InputError("a stop string is empty");
  if (!tokenizer_ && (!request.stop.empty() || request.on_text))
    throw core::InputError("stop strings and streamed text need a tokenizer");
  auto active = std::make_unique<Active>(std::move(request));  // validates sampling params
  active->result.prompt_tokens = prompt;
  {
    std::lock_guard lock(mutex_);
    ++metrics_.requests_total;
    metrics_.prompt_tokens_total += prompt;
    waiting_.push_back(std::move(active));
  }
  wake_.notify_one();
}

void Scheduler::admit() {
  // In arrival order; a request that does not fit yet blocks those behind it (no starvation).
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_batch) {
    Active& a = *waiting_.front();
    const auto seq = engine_.open(static_cast<int64_t>(a.request.prompt.size()) + a.request.max_new_tokens);
    if (!seq) break;
    a.seq = *seq;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::finish(Active& a, const std::string& reason) {
  if (a.done) return;
  a.done = true;
  if (a.seq >= 0) engine_.close(a.seq);
  a.result.finish_reason = reason;
  a.result.tokens = a.generated;
  a.result.text = a.text.substr(0, a.text_emitted);
  a.result.total_ms = ms_since(a.submitted);
  if (reason == "cancelled") ++metrics_.requests_cancelled;
  else ++metrics_.requests_finished;
  if (a.request.on_done) a.request.on_done(a.result);
}

bool Scheduler::step_once() {
  const Clock::time_point began = Clock::now();
  std::vector<SeqId> seqs;
  std::vector<std::span<const int32_t>> chunks;
  std::vector<Active*> batch;
  {
    std::lock_guard lock(mutex_);
    for (auto& a : running_)
      if (*a->request.cancelled) finish(*a, "cancelled");
    std::erase_if(running_, [](const auto& a) { return a->done; });
    for (auto& a : waiting_)
      if (*a->request.cancelled) finish(*a, "cancelled");
    std::erase_if(waiting_, [](const auto& a) { return a->done; });
    admit();
    if (running_.empty()) return false;
    // A chunk's size never depends on the other requests (so neither do its results): the
    // budget only decides whether a request's next chunk runs in this step or a later one.
    int64_t prompt_tokens = 0;
    for (auto& a : running_) {
      std::span<const int32_t> chunk;
      if (a->prefilling()) {
        const int64_t n = std::min<int64_t>(options_.prefill_chunk, a->request.prompt.size() - a->prompt_fed);
        if (prompt_tokens > 0 && prompt_tokens + n > options_.step_prefill_tokens) continue;
        prompt_tokens += n;
        chunk = std::span<const int32_t>(a->request.prompt).subspan(a->prompt_fed, n);
      } else {
        chunk = std::span<const int32_t>(&a->generated.back(), 1);
      }
      seqs.push_back(a->seq);
      chunks.push_back(chunk);
      batch.push_back(a.get());
    }
  }

  const int64_t vocab = engine_.config().vocab_size;
  // When every row is greedy the engine picks the tokens itself (on the GPU, for the CUDA
  // engine): no logits come back and nothing is sampled here.
  const bool all_greedy = std::ranges::all_of(batch, [](const Active* a) { return a->sampler.greedy(); });
  std::vector<int32_t> tokens(batch.size());
  const Clock::time_point engine_began = Clock::now();
  if (all_greedy) {
    engine_.step_greedy(seqs, chunks, tokens);
  } else {
    // Reused across steps: [batch, vocab] floats (2 MB at batch 16 of a 32k vocabulary).
    step_logits_.resize(batch.size() * vocab);
    engine_.step(seqs, chunks, step_logits_);
  }

  const double engine_ms = ms_since(engine_began);
  std::lock_guard lock(mutex_);
  ++metrics_.steps;
  for (const auto& c : chunks) metrics_.step_rows += static_cast<int64_t>(c.size());
  metrics_.engine_seconds += engine_ms / 1e3;
  // The rows that have their next token now (a prompt fed whole), sampled first: a row sampled
  // with a temperature weighs the whole vocabulary (~0.1 ms for 32k entries), so several such
  // rows are sampled on several threads; greedy rows (~10 us) stay on this one.
  std::vector<size_t> sampled;
  size_t weighed = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Active& a = *batch[i];
    if (a.prefilling()) {
      a.prompt_fed += static_cast<int64_t>(chunks[i].size());
      if (a.prefilling()) continue;  // more prompt to feed: no token yet
    }
    sampled.push_back(i);
    weighed += !a.sampler.greedy();
  }
  if (!all_greedy) {
    constexpr size_t kRowsPerThread = 4;  // below this a thread's start costs more than it saves
    const int64_t threads = std::max(1, std::min(options_.sampling_threads, int(weighed / kRowsPerThread)));
    const int64_t rows = static_cast<int64_t>(sampled.size());
    const std::span<const float> logits(step_logits_);
    if (sampling_scratch_.size() < size_t(threads)) sampling_scratch_.resize(threads);
    // Part p of the rows is sampled with scratch p, whichever thread runs it.
    kernels::parallel_for(threads, static_cast<int>(threads), [&](int64_t begin, int64_t end) {
      for (int64_t part = begin; part < end; ++part)
        for (int64_t r = rows * part / threads; r < rows * (part + 1) / threads; ++r) {
          const size_t i = sampled[size_t(r)];
          tokens[i] = batch[i]->sampler.sample(logits.subspan(i * vocab, vocab), sampling_scratch_[size_t(part)]);
        }
    });
  }

  const auto& eos = engine_.config().eos_token_ids;
  for (const size_t i : sampled) {
    Active& a = *batch[i];
    const int32_t token = tokens[i];
    a.generated.push_back(token);
    ++metrics_.generated_tokens_total;
    if (a.generated.size() == 1) a.result.ttft_ms = ms_since(a.submitted);

    const bool is_eos = a.request.stop_at_eos && std::find(eos.begin(), eos.end(), token) != eos.end();
    std::string reason;
    if (is_eos) reason = "stop";
    else if (static_cast<int64_t>(a.generated.size()) >= a.request.max_new_tokens) reason = "length";
    // Text is decoded every step only when someone reads it as it comes (a stream) or a stop
    // string may end the request; otherwise once, at the end. Each step decodes only the newest
    // tokens (decode_stream: a short window for context; it holds back an unfinished character
    // or byte run), so a step costs the same at the 2000th token as at the first.
    const bool text_each_step = tokenizer_ && (a.request.on_text || !a.request.stop.empty());
    if (text_each_step || (tokenizer_ && !reason.empty())) {
      // The eos token itself is not text.
      const std::span<const int32_t> text_ids(a.generated.data(), a.generated.size() - (is_eos ? 1 : 0));
      const size_t old_size = a.text.size();
      a.text += tokenizer_->decode_stream(text_ids, a.text_state, /*skip_special=*/true, /*flush=*/!reason.empty());
      // A stop string can only end in the new text.
      size_t stop_at = std::string::npos;
      for (const auto& s : a.request.stop)
        stop_at = std::min(stop_at, a.text.find(s, old_size - std::min(old_size, s.size() - 1)));
      if (stop_at != std::string::npos) {
        a.text.resize(stop_at);
        reason = "stop";
      }
      // Text that may yet become a stop string is held back too.
      const size_t safe = reason.empty() ? a.text.size() - stop_prefix_suffix(a.text, a.request.stop) : a.text.size();
      if (safe > a.text_emitted) {
        const std::string piece = a.text.substr(a.text_emitted, safe - a.text_emitted);
        a.text_emitted = safe;
        if (a.request.on_text && !a.request.on_text(piece)) reason = "cancelled";
      }
    }
    if (!reason.empty()) finish(a, reason);
  }
  std::erase_if(running_, [](const auto& a) { return a->done; });
  if (running_.empty() && waiting_.empty()) idle_.notify_all();
  metrics_.step_seconds += ms_since(began) / 1e3;
  return true;
}

void Scheduler::run_until_idle() {
  while (step_once()) {
  }
  std::lock_guard lock(mutex_);
  if (!waiting_.empty()) throw core::Error("scheduler: requests wait for KV room that never frees");
}

void Scheduler::start() {
  thread_ = std::thread([this] {
    while (!stopping_) {
      if (step_once()) continue;
      std::unique_lock lock(mutex_);
      idle_.notify_all();
      wake_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stopping_ || !waiting_.empty(); });
    }
  });
}

void Scheduler::stop() {
  stopping_ = true;
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::drain() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return running_.empty() && waiting_.empty(); });
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard lock(mutex_);
  SchedulerMetrics m = metrics_;
  m.running = static_cast<int64_t>(running_.size());
  m.waiting = static_cast<int64_t>(waiting_.size());
  m.kv_capacity_tokens = engine_.kv_capacity_tokens();
  m.kv_free_tokens = engine_.kv_free_tokens();
  return m;
}

}  // namespace gpulab::llm
