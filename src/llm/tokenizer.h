// The Hugging Face `tokenizer.json` BPE tokenizer (GPT-2 / Llama-3 byte-level and Llama-2
// SentencePiece-style), equal to `tokenizers` id for id.
//
// Pipeline, as in `tokenizers`: added tokens are split out of the raw text first, each remaining
// piece is normalized (Prepend, Replace, Strip, NFC), then pre-tokenized (regex Split, ByteLevel,
// Metaspace), then the BPE model turns every pre-token into ids. Decoding maps ids back to token
// strings and runs the decoder chain (Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace).
// Any other component type is refused when the file is loaded, naming the type.
//
// Invalid UTF-8 input (which `tokenizers` cannot take) never throws: regexes see an invalid byte
// as matching nothing (so it lands in a piece of its own), byte-level tokenizers map the raw byte
// to its byte token, and the BPE model treats each invalid byte run as one symbol (byte fallback
// `<0xNN>` per byte, or `unk`). Decoded text is always valid UTF-8: invalid byte runs become U+FFFD
// as in `tokenizers`, so only valid UTF-8 round-trips exactly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpulab::llm {

namespace detail {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  // `path` is a tokenizer.json or a folder holding one. Throws core::InputError naming the file
  // and the problem (malformed JSON, a missing model, an unsupported component type, ...).
  static Tokenizer from_file(const std::filesystem::path& path);

  // `add_special` runs the post-processor (e.g. TemplateProcessing `<s> $A` puts the BOS first),
  // as `encode(text, add_special_tokens=True)` does.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;
  // Unknown ids are skipped; `skip_special` drops added tokens marked special.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t vocab_size() const;  // one past the largest id, added tokens included
  std::optional<int32_t> token_id(std::string_view token) const;  // exact token string lookup
  std::string token_text(int32_t id) const;  // the raw token string; InputError when unknown
  bool is_special(int32_t id) const;         // an added token marked special

  // Streaming detokenization: text for ids[0..n) minus text already emitted, holding back an
  // incomplete UTF-8 sequence and an unfinished run of byte-fallback tokens (a later byte can
  // make the whole run invalid); used by `generate` and `serve` to send tokens as they come. Call with all ids
  // so far (same `state` each time); concatenating the returns gives decode(ids). Only a short
  // window of recent ids is decoded per call. `flush` also emits a held-back tail (at the end).
  struct StreamState {
    size_t prefix_begin = 0;  // ids[prefix_begin, read_begin) were emitted and give context
    size_t read_begin = 0;    // ids from here on are not emitted yet
  };
  std::string decode_stream(std::span<const int32_t> ids, StreamState& state,
                            bool skip_special = false, bool flush = false) const;
  // True when `ids` ends in a run of byte-fallback tokens (<0xNN>) that a ByteFallback decoder
  // decodes as a whole: text from that run may still change, so streams hold it back.
  bool ends_in_byte_run(std::span<const int32_t> ids) const;

 private:
  explicit Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const detail::TokenizerImpl> impl_;
};

}  // namespace gpulab::llm
