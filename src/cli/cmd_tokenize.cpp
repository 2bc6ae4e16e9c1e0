// gpulab tokenize: encode text to ids or decode ids to text with a Hugging Face tokenizer.json.
#include <charconv>
#include <optional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "llm/tokenizer.h"

namespace gpulab::cli {

namespace {

struct TokenizeOptions {
  std::string model;
  std::optional<std::string> text;
  std::optional<std::string> ids;
  bool add_special = false;
  bool skip_special = false;
};

// "1,2,3" (spaces and surrounding [ ] allowed, so `{"ids":[...]}` output can be pasted back).
std::vector<int32_t> parse_ids(std::string_view s, const llm::Tokenizer& tok) {
  const auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v;
  };
  s = trim(s);
  if (s.starts_with('[') && s.ends_with(']')) s = trim(s.substr(1, s.size() - 2));
  std::vector<int32_t> ids;
  if (s.empty()) return ids;
  for (size_t pos = 0; pos <= s.size();) {
    size_t comma = s.find(',', pos);
    if (comma == std::string_view::npos) comma = s.size();
    const std::string_view item = trim(s.substr(pos, comma - pos));
    int32_t id = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      throw core::InputError("--ids: \"" + std::string(item) + "\" is not a token id (give e.g. --ids 1,2,3)");
    if (id < 0 || id >= tok.vocab_size())
      throw core::InputError("--ids: " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(tok.vocab_size()) + ")");
    ids.push_back(id);
    pos = comma + 1;
  }
  return ids;
}

int run_tokenize(const TokenizeOptions& opt) {
  const llm::Tokenizer tok = llm::Tokenizer::from_file(opt.model);
  nlohmann::json out;
  if (opt.text) {
    out["ids"] = tok.encode(*opt.text, opt.add_special);
  } else {
    out["text"] = tok.decode(parse_ids(*opt.ids, tok), opt.skip_special);
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<TokenizeOptions>();
  auto* sub = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids to text, with a tokenizer.json");
  sub->add_option("--model", opt->model, "A tokenizer.json, or a folder holding one (a model folder)")->required();
  auto* text = sub->add_option("--text", opt->text, "Text to encode; prints {\"ids\":[...]}");
  auto* ids = sub->add_option("--ids", opt->ids, "Comma-separated ids to decode; prints {\"text\":\"...\"}");
  text->excludes(ids);
  ids->excludes(text);
  sub->add_flag("--add-special", opt->add_special, "Encode: add the model's special tokens (e.g. the BOS)");
  sub->add_flag("--skip-special", opt->skip_special, "Decode: leave special tokens out of the text");
  sub->footer(
      "Examples:\n"
      "  gpulab tokenize --model ~/models/Llama-3.2-1B --text \"Hello world\"\n"
      "  gpulab tokenize --model ~/models/Llama-3.2-1B --ids 9906,1917\n"
      "Ids are those of Hugging Face `tokenizers` (encode with add_special_tokens as --add-special).");
  sub->callback([&run, opt] {
    if (!opt->text && !opt->ids) throw CLI::ValidationError("tokenize", "give --text TEXT or --ids 1,2,3");
    run = [opt] { return run_tokenize(*opt); };
  });
}

}  // namespace gpulab::cli
