// gpulab logits: a model's logits for a list of token ids, saved as safetensors or summarized.
#include <algorithm>
#include <iostream>
#include <memory>
#include <numeric>
#include <sstream>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "llm/cpu_model.h"
#include "llm/cuda_engine.h"
#include "llm/tp_engine.h"
#include "llm/weights.h"

namespace gpulab::cli {

namespace {

struct LogitsOptions {
  ModelOptions model;
  std::string ids;
  std::string out;
};

// The logits of every position: one engine step over the whole prompt.
std::vector<float> compute_logits(const LogitsOptions& opt, const std::vector<int32_t>& ids) {
  const llm::WeightSource weights = load_weights(opt.model);
  const int tp = opt.model.engine.tp;
  if (opt.model.engine.device == "cpu" && tp != 1) throw core::InputError("--tp needs --device cuda");
  if (opt.model.engine.device == "cpu") return llm::CpuModel(weights, opt.model.engine.threads).logits(ids);
  // One sequence, as long as the prompt: size the KV pool to it, no graphs for a single step.
  llm::EngineOptions cuda = opt.model.engine.cuda;
  cuda.max_batch = 1;
  cuda.max_seq_len = std::min<int64_t>(weights.config().max_position_embeddings,
                                       std::max<int64_t>(static_cast<int64_t>(ids.size()), 16));
  cuda.max_kv_tokens = cuda.max_seq_len;
  cuda.cuda_graphs = false;
  if (tp != 1) return llm::TpEngine(weights, cuda, llm::tp_devices(tp)).logits(ids);
  return llm::CudaEngine(weights, cuda).logits(ids);
}

int run_logits(const LogitsOptions& opt) {
  const std::vector<int32_t> ids = parse_token_ids(opt.ids);
  const std::vector<float> logits = compute_logits(opt, ids);
  const int64_t T = static_cast<int64_t>(ids.size()), V = static_cast<int64_t>(logits.size()) / T;
  if (!opt.out.empty()) {
    core::write_safetensors(opt.out, {{"logits", core::DType::f32, {T, V},
                                       {reinterpret_cast<const uint8_t*>(logits.data()), logits.size() * sizeof(float)}}});
    std::cout << "wrote logits [" << T << ", " << V << "] to " << opt.out << "\n";
    return 0;
  }
  // Without --out: the five most likely next tokens at each position.
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * V;
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + std::min<int64_t>(5, V), order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    std::cout << "position " << t << " (id " << ids[t] << "):";
    for (int64_t k = 0; k < std::min<int64_t>(5, V); ++k) std::cout << "  " << order[k] << " " << row[order[k]];
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

void add_logits_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<LogitsOptions>();
  auto* sub = app.add_subcommand("logits", "Print or save a model's logits for a list of token ids");
  add_model_options(*sub, opt->model);
  sub->add_option("--ids", opt->ids, "Comma-separated token ids")->required();
  sub->add_option("--out", opt->out, "Write float32 tensor `logits` [tokens, vocab] to this .safetensors file");
  sub->footer("Example:\n  gpulab logits --model ~/models/Llama-3.2-1B --ids 128000,9906,1917 --out logits.safetensors");
  sub->callback([&run, opt] { run = [opt] { return run_logits(*opt); }; });
}

}  // namespace gpulab::cli
