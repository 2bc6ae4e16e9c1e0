#include "cli/model_options.h"

#include <climits>
#include <map>
#include <sstream>

#include "core/error.h"

namespace gpulab::cli {

void add_model_options(CLI::App& sub, ModelOptions& opt) {
  sub.add_option("--model", opt.model, "Hugging Face checkpoint folder (config.json, safetensors, tokenizer.json)");
  sub.add_option("--config", opt.config, "With --dummy-weights: a config.json or a built-in shape (llama2-7b, llama3-8b, ...)");
  sub.add_flag("--dummy-weights", opt.dummy_weights, "Random weights of the right shapes instead of a checkpoint");
  sub.add_option("--tokenizer", opt.tokenizer, "tokenizer.json (or its folder) when not in --model");
  sub.add_option("--device", opt.engine.device, "Where to run: cpu (float32 reference) or cuda (bf16 engine)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub.add_option("--gpu-memory-fraction", opt.engine.cuda.gpu_memory_fraction,
                 "Share of free GPU memory for weights, buffers and the KV cache")
      ->check(CLI::Range(0.05, 0.99))
      ->capture_default_str();
  sub.add_option("--cpu-kv-tokens", opt.engine.cpu_kv_tokens, "KV-cache room of the CPU engine, in tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_option("--threads", opt.engine.threads, "CPU threads (0: all)")->capture_default_str();
  sub.add_option("--max-seq-len", opt.engine.cuda.max_seq_len,
                 "With --device cuda: longest prompt + generation (0: the model's, up to 32768)")
      ->capture_default_str();
  sub.add_flag("!--no-cuda-graphs", opt.engine.cuda.cuda_graphs, "With --device cuda: launch decode steps kernel by kernel");
  sub.add_option("--weights", opt.engine.cuda.weights,
                 "With --device cuda: linear layers in bf16, or fp8 (e4m3, per-channel scales; quantized at load "
                 "unless the checkpoint is fp8 already)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, llm::WeightFormat>{{"bf16", llm::WeightFormat::bf16}, {"fp8", llm::WeightFormat::fp8}})
                     .description(""))
      ->type_name("{bf16,fp8}")
      ->default_str("bf16");
  sub.add_option("--fp8-activation-scale", opt.engine.cuda.fp8_activations,
                 "With --weights fp8: activation scales per token, or per tensor (one amax per step over the batch)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, llm::Fp8ActivationScale>{
          {"token", llm::Fp8ActivationScale::token}, {"tensor", llm::Fp8ActivationScale::tensor}})
                     .description(""))
      ->type_name("{token,tensor}")
      ->default_str("token");
  sub.add_option("--tp", opt.engine.tp,
                 "With --device cuda: tensor parallel over GPUs 0..N-1 (heads, MLP and vocabulary split, NCCL)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
}

llm::WeightSource load_weights(const ModelOptions& opt) {
  if (opt.engine.device == "cpu" && opt.engine.cuda.weights != llm::WeightFormat::bf16)
    throw core::InputError("--weights fp8 needs --device cuda (the CPU reference computes in float32)");
  if (opt.dummy_weights) {
    if (opt.config.empty()) throw core::InputError("--dummy-weights needs --config FILE|NAME");
    return llm::WeightSource::random(llm::config_from_arg(opt.config));
  }
  if (opt.model.empty()) throw core::InputError("give --model DIR (or --dummy-weights --config NAME)");
  return llm::WeightSource::from_checkpoint(opt.model);
}

llm::Tokenizer load_tokenizer(const ModelOptions& opt) {
  if (!opt.tokenizer.empty()) return llm::Tokenizer::from_file(opt.tokenizer);
  if (opt.model.empty() && opt.dummy_weights)
    throw core::InputError("give --tokenizer FILE: --dummy-weights has no tokenizer of its own");
  if (opt.model.empty()) throw core::InputError("give --model DIR (or --dummy-weights --config NAME --tokenizer FILE)");
  return llm::Tokenizer::from_file(opt.model);
}

std::vector<int32_t> parse_token_ids(const std::string& text) {
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

}  // namespace gpulab::cli
