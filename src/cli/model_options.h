// Options shared by the commands that load a LLaMA-family model (logits, generate, serve).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "llm/make_engine.h"
#include "llm/tokenizer.h"
#include "llm/weights.h"

namespace gpulab::cli {

struct ModelOptions {
  std::string model;   // checkpoint folder
  std::string config;  // with dummy_weights: config.json or built-in shape
  bool dummy_weights = false;
  std::string tokenizer;  // tokenizer.json or folder; default: the model folder
  llm::EngineSpec engine;
};

void add_model_options(CLI::App& sub, ModelOptions& opt);
llm::WeightSource load_weights(const ModelOptions& opt);
llm::Tokenizer load_tokenizer(const ModelOptions& opt);
// "1,2,3" -> token ids; InputError naming the bad item (or an empty list).
std::vector<int32_t> parse_token_ids(const std::string& text);

}  // namespace gpulab::cli
