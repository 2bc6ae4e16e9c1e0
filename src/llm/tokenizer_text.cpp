#include "llm/tokenizer_text.h"

#include <pcre2.h>

#include <algorithm>
#include <stdexcept>

#include "core/error.h"

namespace gpulab::llm::detail {

Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return {b0, 1, true};
  // Lead byte -> sequence length, and the allowed range of the second byte (Unicode table 3-7).
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  uint32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0xFFFD, 1, false};
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (i + k >= s.size()) break;
    const uint8_t b = byte(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (k < need) return {0xFFFD, k, false};
  return {cp, need, true};
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Step st = utf8_step(bytes, i);
    if (st.valid)
      out.append(bytes.substr(i, st.length));
    else
      append_utf8(out, 0xFFFD);
    i += st.length;
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Step st = utf8_step(bytes, i);
    if (!st.valid) return false;
    i += st.length;
  }
  return true;
}

bool ends_with_replacement_char(std::string_view text) { return text.ends_with("\xEF\xBF\xBD"); }

bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::optional<uint32_t> code_point_before(std::string_view s, size_t i) {
  size_t j = i - 1;
  while (j > 0 && i - j < 4 && (static_cast<uint8_t>(s[j]) & 0xC0) == 0x80) --j;
  const Utf8Step st = utf8_step(s, j);
  if (!st.valid || j + st.length != i) return std::nullopt;
  return st.code_point;
}

namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // code points used are all below 256 + 68
  ByteTables() {
    to_byte.fill(-1);
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<uint32_t>(b) : extra++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_char() { return byte_tables().to_char; }

std::optional<uint8_t> char_to_byte(uint32_t cp) {
  const auto& t = byte_tables().to_byte;
  if (cp >= t.size() || t[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(t[cp]);
}

namespace {

struct Segment {
  size_t begin, end;
  bool is_match;
};

// The whole text cut into matches and the gaps between them (Pattern::find_matches).
std::vector<Segment> segments(std::string_view text, const std::vector<Range>& matches, bool invert) {
  if (text.empty()) return {{0, 0, false}};
  std::vector<Segment> out;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) out.push_back({prev, b, invert});
    out.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != text.size()) out.push_back({prev, text.size(), invert});
  return out;
}

}  // namespace

std::vector<Range> split_ranges(std::string_view text, const std::vector<Range>& matches, SplitBehavior behavior,
                                bool invert) {
  const std::vector<Segment> segs = segments(text, matches, invert);
  std::vector<Range> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Segment& s : segs) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segs)
        if (!s.is_match) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kContiguous:
      for (const Segment& s : segs) {
        if (s.is_match == previous_match && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.begin, s.end);
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Segment& s : segs) {
        if (s.is_match && !previous_match && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.begin, s.end);
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty())
          out.back().first = it->begin;
        else
          out.emplace_back(it->begin, it->end);
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
                             &offset, nullptr);
  if (!code->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::invalid_argument("regex " + std::string(pattern) + " does not compile: " +
                                reinterpret_cast<const char*>(message) + " at offset " + std::to_string(offset));
  }
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);  // the interpreter is used where JIT is unavailable
  code_ = std::move(code);
}

std::vector<Range> Regex::find_all(std::string_view subject) const {
  std::vector<Range> out;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  std::optional<size_t> last_end;
  while (pos <= subject.size()) {
    const int rc = pcre2_match(code_->code, data, subject.size(), pos, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw core::Error(std::string("tokenizer regex match failed: ") + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ov[0], end = ov[1];
    if (begin == end && last_end == end) {
      if (pos == subject.size()) break;
      pos += utf8_step(subject, pos).length;
      continue;
    }
    out.emplace_back(begin, end);
    pos = end;
    last_end = end;
  }
  return out;
}

bool Regex::matches_whole(std::string_view subject) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0,
                             PCRE2_ANCHORED | PCRE2_ENDANCHORED, md.get(), nullptr);
  return rc >= 0;
}

}  // namespace gpulab::llm::detail
