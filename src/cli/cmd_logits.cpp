// gpulab logits: a model's logits for a list of token ids, saved as safetensors or summarized.
#include <algorithm>
#include <iostream>
#include <memory>
#include <numeric>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "llm/cpu_model.h"
#include "llm/cuda_engine.h"
#include "llm/weights.h"

namespace gpulab::cli {

namespace {

struct LogitsOptions {
  std::string model;
  std::string config;
  bool dummy_weights = false;
  std::string ids;
  std::string device = "cpu";
  std::string out;
  int threads = 0;
  double gpu_memory_fraction = 0.9;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX)
      throw core::InputError("--ids: \"" + item + "\" is not a token id (want e.g. --ids 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw core::InputError("--ids: no token ids given");
  return ids;
}

llm::WeightSource weight_source(const LogitsOptions& opt) {
  if (opt.dummy_weights) {
    if (opt.config.empty()) throw core::InputError("--dummy-weights needs --config FILE|NAME");
    return llm::WeightSource::random(llm::config_from_arg(opt.config));
  }
  if (opt.model.empty()) throw core::InputError("give --model DIR (or --dummy-weights --config NAME)");
  return llm::WeightSource::from_checkpoint(opt.model);
}

std::vector<float> compute_logits(const LogitsOptions& opt, const std::vector<int32_t>& ids) {
  const llm::WeightSource weights = weight_source(opt);
  if (opt.device == "cpu") return llm::CpuModel(weights, opt.threads).logits(ids);
  llm::EngineOptions engine;
  engine.gpu_memory_fraction = opt.gpu_memory_fraction;
  engine.max_batch = 1;
  engine.max_seq_len = std::min<int64_t>(weights.config().max_position_embeddings,
                                         std::max<int64_t>(static_cast<int64_t>(ids.size()), 16));
  engine.max_kv_tokens = engine.max_seq_len;
  engine.cuda_graphs = false;
  return llm::CudaEngine(weights, engine).logits(ids);
}

int run_logits(const LogitsOptions& opt) {
  const std::vector<int32_t> ids = parse_ids(opt.ids);
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
  sub->add_option("--model", opt->model, "Hugging Face checkpoint folder (config.json + safetensors)");
  sub->add_option("--config", opt->config, "With --dummy-weights: a config.json or a built-in shape (llama2-7b, llama3-8b, ...)");
  sub->add_flag("--dummy-weights", opt->dummy_weights, "Random weights of the right shapes instead of a checkpoint");
  sub->add_option("--ids", opt->ids, "Comma-separated token ids")->required();
  sub->add_option("--device", opt->device, "Where to run: cpu (float32 reference) or cuda (bf16 engine)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--out", opt->out, "Write float32 tensor `logits` [tokens, vocab] to this .safetensors file");
  sub->add_option("--threads", opt->threads, "CPU threads (0: all)")->capture_default_str();
  sub->add_option("--gpu-memory-fraction", opt->gpu_memory_fraction,
                  "With --device cuda: share of GPU memory for weights, buffers and KV cache")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  sub->footer("Example:\n  gpulab logits --model ~/models/Llama-3.2-1B --ids 128000,9906,1917 --out logits.safetensors");
  sub->callback([&run, opt] { run = [opt] { return run_logits(*opt); }; });
}

}  // namespace gpulab::cli
