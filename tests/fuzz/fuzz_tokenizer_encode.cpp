// Arbitrary bytes (invalid UTF-8 included) through both fixture tokenizers (byte-level BPE and
// SentencePiece-style) and the byte-level one with an NFC normalizer (as Qwen2's tokenizer.json
// has): encode never throws, ids are in the vocabulary, decode gives valid UTF-8, and streaming
// detokenization concatenates to decode(). NFC itself is idempotent.
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz/fuzz_util.h"
#include "llm/nfc.h"
#include "llm/tokenizer.h"

using namespace gpulab;

namespace {

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// The byte-level fixture with {"normalizer": {"type": "NFC"}}, written to the scratch folder.
llm::Tokenizer bytelevel_with_nfc() {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(std::string(GPULAB_TEST_DATA) + "/tokenizer_bytelevel/tokenizer.json"));
  j["normalizer"] = {{"type", "NFC"}};
  const auto path = fuzz::scratch_dir() / "tokenizer_nfc.json";
  fuzz::write_bytes(path, j.dump());
  return llm::Tokenizer::from_file(path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const llm::Tokenizer tokenizers[] = {
      llm::Tokenizer::from_file(std::string(GPULAB_TEST_DATA) + "/tokenizer_bytelevel"),
      llm::Tokenizer::from_file(std::string(GPULAB_TEST_DATA) + "/tokenizer_spm"), bytelevel_with_nfc()};
  const std::string_view text = fuzz::as_text(data, size);
  const std::string normalized = llm::detail::nfc(text);
  fuzz::check(llm::detail::nfc(normalized) == normalized, "NFC is idempotent");
  for (const auto& tok : tokenizers) {
    const std::vector<int32_t> ids = tok.encode(text, size % 2 == 0);
    for (int32_t id : ids) fuzz::check(id >= 0 && id < tok.vocab_size(), "encoded ids are in the vocabulary");
    const std::string decoded = tok.decode(ids);
    fuzz::check(valid_utf8(decoded), "decoded text is valid UTF-8");
    if (valid_utf8(std::string(text)) && text.find('\0') == std::string_view::npos)
      (void)tok.encode(decoded);  // decoded text encodes again
    llm::Tokenizer::StreamState state;
    std::string streamed;
    for (size_t n = 1; n <= ids.size(); ++n)
      streamed += tok.decode_stream(std::span(ids).first(n), state, false, n == ids.size());
    fuzz::check(streamed == decoded, "streamed pieces concatenate to decode()");
  }
  return 0;
}
