// Continuous batching: requests join and leave the running batch at any step. Each step carries
// every running request's last sampled token, and the next prompt chunks (long prompts are
// prefilled in chunks) of as many requests as the step's prompt-token budget allows. A request
// is admitted when the engine has KV room for its prompt plus max_new_tokens; until then it
// waits in the queue.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "llm/engine.h"
#include "llm/sampling.h"
#include "llm/tokenizer.h"

namespace gpulab::llm {

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (the stop string's tokens included)
  std::string text;             // generated text, cut before a stop string
  std::string finish_reason;    // "stop" (eos or stop string), "length", "cancelled"
  int64_t prompt_tokens = 0;
  double ttft_ms = 0;   // submit to first generated token
  double total_ms = 0;  // submit to finish
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings
  bool stop_at_eos = true;
  // Called on the scheduler thread with each new piece of text (possibly empty while bytes of a
  // character or a possible stop string are held back). Returning false cancels the request
  // (the client went away); its KV room is freed at once.
  std::function<bool(const std::string& piece)> on_text;
  std::function<void(const GenerationResult&)> on_done;
  // Set by another thread (e.g. the HTTP handler of a client that left) to drop the request
  // at the next step, waiting or running.
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
};

struct SchedulerOptions {
  int64_t max_batch = 64;        // capped by the engine's
  int64_t prefill_chunk = 512;   // prompt tokens a sequence feeds per step
  // Prompt tokens all requests feed in one step together: whole chunks in admission order while
  // the budget lasts (the first always runs). It bounds a step's time, so requests already
  // decoding keep their pace while long prompts arrive (vLLM's chunked-prefill token budget).
  int64_t step_prefill_tokens = 2048;
  int sampling_threads = 0;      // most threads sampling a step's rows; 0: half the cores, at most 8
};

struct SchedulerMetrics {
  int64_t requests_total = 0, requests_finished = 0, requests_cancelled = 0;
  int64_t running = 0, waiting = 0;
  int64_t prompt_tokens_total = 0, generated_tokens_total = 0;
  int64_t kv_capacity_tokens = 0, kv_free_tokens = 0;
  int64_t steps = 0;
  int64_t step_rows = 0;        // tokens fed to the engine over all steps (prompt chunks + one per decode)
  double engine_seconds = 0;    // wall time inside the engine's step
  double step_seconds = 0;      // wall time of whole steps: the engine, sampling, text, callbacks
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const Tokenizer& tokenizer, SchedulerOptions options = {});
  // Without a tokenizer requests produce tokens only (no text, no stop strings): benchmarks on
  // random weights whose vocabulary no tokenizer covers.
  explicit Scheduler(Engine& engine, SchedulerOptions options = {});
  ~Scheduler();  // stops the thread; unfinished requests end "cancelled"

  // Queues a request. Throws core::InputError when it can never run: empty prompt, prompt plus
  // max_new_tokens beyond the context length or the whole KV capacity.
  void submit(GenerationRequest request);

  void start();            // runs steps on a background thread until stop()
  void stop();             // finishes nothing more; waits for the thread
  void drain();            // blocks until no request is waiting or running
  // Runs steps on the calling thread until idle (for `generate`, without a background thread).
  void run_until_idle();

  SchedulerMetrics metrics() const;

 private:
  struct Active;
  bool step_once();  // false when idle
  void admit();
  void finish(Active& a, const std::string& reason);

  Engine& engine_;
  const Tokenizer* tokenizer_;  // null: tokens only
  SchedulerOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::unique_ptr<Active>> waiting_;
  std::vector<std::unique_ptr<Active>> running_;
  SchedulerMetrics metrics_;
  std::vector<float> step_logits_;  // the engine's output of the last step (scheduler thread only)
  std::vector<SamplingScratch> sampling_scratch_;  // one per sampling thread of a step (scheduler thread only)
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace gpulab::llm
