// Text helpers for the tokenizer: strict UTF-8 walking (Rust's rules, so lossy conversion gives
// the same U+FFFD as `tokenizers`), the GPT-2 byte<->char table, and a PCRE2 regex with the
// match iteration of Oniguruma's find_iter (which `tokenizers` uses).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpulab::llm::detail {

// One step through UTF-8 bytes: a valid character, or the maximal invalid run that Rust's
// from_utf8_lossy turns into one U+FFFD.
struct Utf8Step {
  uint32_t code_point;  // 0xFFFD when !valid
  size_t length;        // bytes consumed, at least 1
  bool valid;
};
Utf8Step utf8_step(std::string_view s, size_t i);

void append_utf8(std::string& out, uint32_t code_point);
inline size_t utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }
std::string utf8_lossy(std::string_view bytes);  // Rust String::from_utf8_lossy
bool is_valid_utf8(std::string_view bytes);
bool ends_with_replacement_char(std::string_view text);
// Rust char::is_whitespace (the Unicode White_Space property).
bool is_whitespace(uint32_t code_point);
// The code point just before byte i (i > 0); nullopt if the bytes there are not a valid character.
std::optional<uint32_t> code_point_before(std::string_view s, size_t i);

// GPT-2's byte-level alphabet: each byte as a printable code point.
const std::array<uint32_t, 256>& byte_to_char();
std::optional<uint8_t> char_to_byte(uint32_t code_point);

using Range = std::pair<size_t, size_t>;  // [begin, end) in bytes

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// NormalizedString::split of `tokenizers`: the pieces a text is cut into, given the matches of the
// delimiter pattern (sorted, non-overlapping) and what to do with them. `invert` makes the
// matches the content and the gaps the delimiters. Empty ranges may be returned.
std::vector<Range> split_ranges(std::string_view text, const std::vector<Range>& matches, SplitBehavior behavior,
                                bool invert = false);

// A compiled PCRE2 pattern (UTF, UCP; invalid UTF-8 in the subject matches nothing). Shareable
// between threads: match data is per call.
class Regex {
 public:
  // Throws std::invalid_argument with PCRE2's message and the offset when it does not compile.
  explicit Regex(std::string_view pattern);
  // Non-overlapping matches left to right; an empty match right after the previous match is
  // skipped, as Oniguruma's find_iter does.
  std::vector<Range> find_all(std::string_view subject) const;
  bool matches_whole(std::string_view subject) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

}  // namespace gpulab::llm::detail
