// tokenizer.json -> pipeline objects, and encode/decode. Component semantics follow the
// `tokenizers` crate (0.23) step for step; comments name the places where that matters.
#include "llm/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "llm/nfc.h"
#include "llm/tokenizer_text.h"

namespace gpulab::llm {

namespace detail {

namespace {

using nlohmann::json;

// A stretch of the text on its way through the pipeline.
struct Piece {
  std::string text;
  int32_t id = -1;        // an added token's id, or -1 while it still needs the model
  bool at_start = false;  // begins at offset 0 of the input (Metaspace prepend_scheme "first")
};
using Pieces = std::vector<Piece>;

using Normalizer = std::function<void(std::string&)>;
using PreTokenizer = std::function<void(Pieces&)>;
using Decoder = std::function<void(std::vector<std::string>&)>;
using PostProcessor = std::function<std::vector<int32_t>(std::vector<int32_t>)>;

// Replaces each text piece by the ranges `split` cuts it into; empty ones are dropped, as
// PreTokenizedString::split does. `split` may rewrite the piece's text first.
template <class Split>
void split_pieces(Pieces& pieces, Split&& split) {
  Pieces out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    if (p.id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    for (const auto& [b, e] : split(p))
      if (e > b) out.push_back({p.text.substr(b, e - b), -1, p.at_start && b == 0});
  }
  pieces = std::move(out);
}

std::vector<Range> find_literal(std::string_view text, std::string_view needle) {
  std::vector<Range> out;
  for (size_t pos = text.find(needle); pos != std::string_view::npos; pos = text.find(needle, pos + needle.size()))
    out.emplace_back(pos, pos + needle.size());
  return out;
}

void replace_all(std::string& text, const std::vector<Range>& matches, std::string_view content) {
  if (matches.empty()) return;
  std::string out;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(text, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(text, prev);
  text = std::move(out);
}

// ---------------------------------------------------------------------------------------------
// The BPE model.

class BpeModel {
 public:
  std::unordered_map<std::string, int32_t> vocab;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string continuing_subword_prefix, end_of_word_suffix;

  // The ids of the byte-fallback tokens <0x00>..<0xFF>, once the vocab is complete.
  void index_byte_tokens() {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = vocab.find(name);
      byte_ids_[b] = it == vocab.end() ? -1 : it->second;
    }
  }

  void reserve_merges(size_t n) { merges_.reserve(n); }
  void add_merge(int32_t left, int32_t right, int32_t rank, int32_t merged) {
    merges_[key(left, right)] = {rank, merged};  // a later duplicate wins, as in the HashMap collect
  }

  void encode(const std::string& word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges)
      if (auto it = vocab.find(word); it != vocab.end()) return out.push_back(it->second);
    const bool cacheable = word.size() < kCacheMaxKey;
    if (cacheable) {
      std::lock_guard lock(cache_mutex_);
      if (auto it = cache_.find(word); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids = merge_word(word);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
      std::lock_guard lock(cache_mutex_);
      if (cache_.size() < kCacheCapacity) cache_.emplace(word, std::move(ids));
    }
  }

 private:
  static constexpr size_t kCacheCapacity = 10000;  // `tokenizers` uses the same bound
  static constexpr size_t kCacheMaxKey = 256;

  struct MergeInfo {
    int32_t rank, merged;
  };
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    size_t len;  // 0 once merged into its left neighbour
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const MergeInfo* find_merge(int32_t a, int32_t b) const {
    auto it = merges_.find(key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  std::optional<int32_t> lookup(const std::string& s) const {
    auto it = vocab.find(s);
    if (it == vocab.end()) return std::nullopt;
    return it->second;
  }

  // BPE::merge_word then Word::merge_all.
  std::vector<int32_t> merge_word(const std::string& w) const {
    std::vector<Symbol> symbols;
    symbols.reserve(w.size());
    const auto add = [&](int32_t id, size_t len) {
      const auto n = static_cast<int32_t>(symbols.size());
      symbols.push_back({id, n - 1, -1, len});
      if (n > 0) symbols[n - 1].next = n;
    };
    // An unknown symbol waits here so that fuse_unk can join it with the next unknown one.
    int32_t unk = -1;
    size_t unk_len = 0;
    const auto flush_unk = [&] {
      if (unk >= 0) add(unk, unk_len);
      unk = -1;
    };
    for (size_t i = 0; i < w.size();) {
      const size_t len = utf8_step(w, i).length;  // an invalid byte run is one symbol
      std::string s = w.substr(i, len);
      if (i > 0) s = continuing_subword_prefix + s;
      if (i + len == w.size()) s += end_of_word_suffix;
      i += len;
      if (auto id = lookup(s)) {
        flush_unk();
        add(*id, len);
        continue;
      }
      if (byte_fallback) {
        if (std::all_of(s.begin(), s.end(), [&](unsigned char b) { return byte_ids_[b] >= 0; })) {
          for (unsigned char b : s) add(byte_ids_[b], 1);
          continue;
        }
      }
      if (unk_id) {
        if (unk >= 0 && fuse_unk) {
          unk_len += len;
        } else {
          flush_unk();
          unk = *unk_id, unk_len = len;
        }
      }
    }
    flush_unk();

    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      if (const MergeInfo* m = find_merge(symbols[i].id, symbols[i + 1].id))
        queue.push({m->rank, static_cast<int32_t>(i), m->merged});
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& cur = symbols[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const Symbol right = symbols[cur.next];
      const MergeInfo* m = find_merge(cur.id, right.id);
      if (!m || m->merged != top.merged) continue;  // stale entry
      cur.id = top.merged;
      cur.len += right.len;
      symbols[cur.next].len = 0;
      cur.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = top.pos;
      if (cur.prev >= 0)
        if (const MergeInfo* pm = find_merge(symbols[cur.prev].id, cur.id))
          queue.push({pm->rank, cur.prev, pm->merged});
      if (cur.next >= 0)
        if (const MergeInfo* nm = find_merge(cur.id, symbols[cur.next].id)) queue.push({nm->rank, top.pos, nm->merged});
    }
    std::vector<int32_t> ids;
    for (const Symbol& s : symbols)
      if (s.len) ids.push_back(s.id);
    return ids;
  }

  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::array<int32_t, 256> byte_ids_{};
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// ---------------------------------------------------------------------------------------------
// Added tokens: found in the raw text (and, for `normalized` ones, in the normalized text) before
// the model sees anything, leftmost-longest like the aho-corasick matcher of AddedVocabulary.

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, single_word, lstrip, rstrip, normalized;
  std::string text;  // what decode shows: `tokenizers` gives a normalized token in its normalized form
};

class AddedTokenMatcher {
 public:
  void add(std::string_view pattern, const AddedToken* token) {
    if (pattern.empty()) return;
    int node = 0;
    for (unsigned char c : pattern) {
      auto [it, inserted] = nodes_[node].next.try_emplace(c, static_cast<int>(nodes_.size()));
      if (inserted) nodes_.emplace_back();
      node = it->second;
    }
    nodes_[node].token = token;
  }
  bool empty() const { return nodes_[0].next.empty(); }

  // AddedVocabulary::find_matches: the text cut into ranges, each with its added token's id or -1.
  std::vector<std::pair<Range, int32_t>> find(std::string_view s, const Regex& word_char) const {
    std::vector<std::pair<Range, int32_t>> out;
    size_t start_offset = 0, pos = 0;
    while (pos < s.size()) {
      auto [token, begin, end] = next_match(s, pos);
      if (!token) break;
      pos = end;  // the matcher resumes after a match, even one rejected below
      if (token->single_word) {
        const bool space_before = begin == 0 || !is_word_char(s.substr(0, begin), true, word_char);
        const bool space_after = end == s.size() || !is_word_char(s.substr(end), false, word_char);
        if (!space_before || !space_after) continue;
      }
      if (token->lstrip) {
        size_t b = begin;
        while (b > 0) {
          const auto cp = code_point_before(s, b);
          if (!cp || !is_whitespace(*cp)) break;
          b -= utf8_length(*cp);
        }
        begin = std::max(b, start_offset);
      }
      if (token->rstrip) {
        while (end < s.size()) {
          const Utf8Step st = utf8_step(s, end);
          if (!st.valid || !is_whitespace(st.code_point)) break;
          end += st.length;
        }
      }
      if (start_offset < begin) out.push_back({{start_offset, begin}, -1});
      out.push_back({{begin, end}, token->id});
      start_offset = end;
      pos = end;
    }
    if (start_offset < s.size()) out.push_back({{start_offset, s.size()}, -1});
    return out;
  }

 private:
  struct Node {
    std::map<unsigned char, int> next;
    const AddedToken* token = nullptr;
  };
  struct Match {
    const AddedToken* token;
    size_t begin, end;
  };

  Match next_match(std::string_view s, size_t from) const {
    for (size_t b = from; b < s.size(); ++b) {
      int node = 0;
      Match best{nullptr, b, b};
      for (size_t i = b; i < s.size(); ++i) {
        auto it = nodes_[node].next.find(static_cast<unsigned char>(s[i]));
        if (it == nodes_[node].next.end()) break;
        node = it->second;
        if (nodes_[node].token) best = {nodes_[node].token, b, i + 1};
      }
      if (best.token) return best;
    }
    return {nullptr, 0, 0};
  }

  // Whether the text ends (at_end) or starts with a word character.
  static bool is_word_char(std::string_view text, bool at_end, const Regex& word_char) {
    if (text.empty()) return false;
    if (at_end) {
      auto cp = code_point_before(text, text.size());
      if (!cp) return false;
      std::string c;
      append_utf8(c, *cp);
      return word_char.matches_whole(c);
    }
    const Utf8Step st = utf8_step(text, 0);
    return st.valid && word_char.matches_whole(text.substr(0, st.length));
  }

  std::vector<Node> nodes_ = std::vector<Node>(1);
};

}  // namespace

struct TokenizerImpl {
  std::string file;
  BpeModel model;
  std::vector<AddedToken> added;                   // id order is not assumed
  std::unordered_map<std::string, int32_t> added_by_text;
  std::unordered_map<int32_t, const AddedToken*> added_by_id;
  std::unordered_map<int32_t, std::string> model_tokens;  // id -> token text
  AddedTokenMatcher raw_matcher, normalized_matcher;
  // Unicode \w as `tokenizers` (regex-syntax) has it for single_word; PCRE2's \w lacks marks.
  Regex word_char{"[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]"};
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  std::vector<Decoder> decoders;
  bool has_decoder = false;
  bool byte_fallback_decoder = false;  // a ByteFallback decoder is in the chain
  std::vector<PostProcessor> post_processors;
  std::vector<int32_t> post_processor_ids;  // checked against the vocabulary once it is known
  int32_t vocab_size = 0;

  [[noreturn]] void fail(const std::string& what) const { throw core::InputError(file + ": " + what); }

  void normalize(std::string& text) const {
    for (const Normalizer& n : normalizers) n(text);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;
};

namespace {

// Cuts the text pieces at added tokens, which become pieces carrying their ids.
void split_added(Pieces& pieces, const AddedTokenMatcher& matcher, const Regex& word_char) {
  if (matcher.empty()) return;
  Pieces out;
  for (Piece& p : pieces) {
    if (p.id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    for (const auto& [range, id] : matcher.find(p.text, word_char))
      out.push_back({p.text.substr(range.first, range.second - range.first), id, p.at_start && range.first == 0});
  }
  pieces = std::move(out);
}

// ---------------------------------------------------------------------------------------------
// Building the pipeline from JSON.

int32_t id_of(const TokenizerImpl& t, const json& id, const std::string& what) {
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX)
    t.fail(what + " has a bad id " + id.dump());
  return id.get<int32_t>();
}

// A non-negative integer (a float or a negative value is refused, not cast).
size_t count_of(const TokenizerImpl& t, const json& j, const char* what) {
  if (!j.is_number_unsigned()) t.fail(std::string(what) + " must be a non-negative integer, is " + j.dump());
  return j.get<size_t>();
}

std::string type_of(const TokenizerImpl& t, const json& j, const char* what) {
  if (!j.is_object()) t.fail(std::string(what) + " is not an object");
  if (!j.contains("type") || !j["type"].is_string()) t.fail(std::string(what) + " has no \"type\"");
  return j["type"].get<std::string>();
}

uint32_t single_char(const TokenizerImpl& t, const json& j, const char* what) {
  const std::string s = j.get<std::string>();
  if (s.empty()) t.fail(std::string(what) + " is empty");
  const Utf8Step st = utf8_step(s, 0);
  if (!st.valid || st.length != s.size()) t.fail(std::string(what) + " must be one character");
  return st.code_point;
}

// {"String": s} or {"Regex": r}: the matches of a Replace / Split pattern.
std::function<std::vector<Range>(std::string_view)> pattern_of(const TokenizerImpl& t, const json& j) {
  if (j.contains("String")) {
    const std::string s = j["String"].get<std::string>();
    if (s.empty()) t.fail("an empty String pattern");
    return [s](std::string_view text) { return find_literal(text, s); };
  }
  if (j.contains("Regex")) {
    try {
      auto re = std::make_shared<Regex>(j["Regex"].get<std::string>());
      return [re](std::string_view text) { return re->find_all(text); };
    } catch (const std::invalid_argument& e) {
      t.fail(e.what());
    }
  }
  t.fail("a pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

void add_normalizer(TokenizerImpl& t, const json& j) {
  if (j.is_null()) return;
  const std::string type = type_of(t, j, "normalizer");
  if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) add_normalizer(t, n);
  } else if (type == "Prepend") {
    t.normalizers.push_back([p = j.at("prepend").get<std::string>()](std::string& s) {
      if (!s.empty()) s.insert(0, p);
    });
  } else if (type == "Replace") {
    t.normalizers.push_back([find = pattern_of(t, j.at("pattern")), c = j.at("content").get<std::string>()](
                                std::string& s) { replace_all(s, find(s), c); });
  } else if (type == "Strip") {
    const bool left = j.value("strip_left", false), right = j.value("strip_right", false);
    t.normalizers.push_back([left, right](std::string& s) {
      size_t b = 0, e = s.size();
      while (left && b < e) {
        const Utf8Step st = utf8_step(s, b);
        if (!st.valid || !is_whitespace(st.code_point)) break;
        b += st.length;
      }
      while (right && e > b) {
        auto cp = code_point_before(s, e);
        if (!cp || !is_whitespace(*cp)) break;
        e -= utf8_length(*cp);
      }
      s = s.substr(b, e - b);
    });
  } else if (type == "NFC") {
    t.normalizers.push_back([](std::string& s) { s = nfc(s); });
  } else {
    t.fail("unsupported normalizer " + type + " (gpulab supports Sequence, Prepend, Replace, Strip, NFC)");
  }
}

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

SplitBehavior behavior_of(const TokenizerImpl& t, const std::string& name) {
  static const std::map<std::string, SplitBehavior> kNames = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous}};
  auto it = kNames.find(name);
  if (it == kNames.end()) t.fail("unknown split behavior " + name);
  return it->second;
}

enum class PrependScheme { kAlways, kFirst, kNever };

PrependScheme prepend_scheme_of(const TokenizerImpl& t, const json& j) {
  if (j.contains("prepend_scheme")) {
    const std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    t.fail("unknown Metaspace prepend_scheme " + s);
  }
  return j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;  // older files
}

void add_pre_tokenizer(TokenizerImpl& t, const json& j) {
  if (j.is_null()) return;
  const std::string type = type_of(t, j, "pre_tokenizer");
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) add_pre_tokenizer(t, p);
  } else if (type == "Split") {
    auto find = pattern_of(t, j.at("pattern"));
    const SplitBehavior behavior = behavior_of(t, j.at("behavior").get<std::string>());
    const bool invert = j.value("invert", false);
    t.pre_tokenizers.push_back([find, behavior, invert](Pieces& pieces) {
      split_pieces(pieces, [&](Piece& p) { return split_ranges(p.text, find(p.text), behavior, invert); });
    });
  } else if (type == "ByteLevel") {
    const bool add_prefix_space = j.value("add_prefix_space", true);
    std::shared_ptr<Regex> re;
    if (j.value("use_regex", true)) re = std::make_shared<Regex>(kGpt2Pattern);
    t.pre_tokenizers.push_back([add_prefix_space, re](Pieces& pieces) {
      split_pieces(pieces, [&](Piece& p) -> std::vector<Range> {
        if (add_prefix_space && !p.text.starts_with(' ')) p.text.insert(0, " ");
        if (!re) return {{0, p.text.size()}};
        return split_ranges(p.text, re->find_all(p.text), SplitBehavior::kIsolated);
      });
      const auto& table = byte_to_char();
      for (Piece& p : pieces) {
        if (p.id >= 0) continue;
        std::string mapped;
        mapped.reserve(p.text.size() * 2);
        for (unsigned char b : p.text) append_utf8(mapped, table[b]);
        p.text = std::move(mapped);
      }
    });
  } else if (type == "Metaspace") {
    std::string rep;
    append_utf8(rep, single_char(t, j.at("replacement"), "Metaspace replacement"));
    const PrependScheme scheme = prepend_scheme_of(t, j);
    const bool split = j.value("split", true);
    t.pre_tokenizers.push_back([rep, scheme, split](Pieces& pieces) {
      split_pieces(pieces, [&](Piece& p) -> std::vector<Range> {
        replace_all(p.text, find_literal(p.text, " "), rep);
        const bool prepend = scheme == PrependScheme::kAlways || (scheme == PrependScheme::kFirst && p.at_start);
        if (prepend && !p.text.starts_with(rep)) p.text.insert(0, rep);
        if (!split) return {{0, p.text.size()}};
        return split_ranges(p.text, find_literal(p.text, rep), SplitBehavior::kMergedWithNext);
      });
    });
  } else {
    t.fail("unsupported pre_tokenizer " + type + " (gpulab supports Sequence, Split, ByteLevel, Metaspace)");
  }
}

// The byte a ByteFallback token <0xNN> stands for (u8::from_str_radix rules: an optional '+').
std::optional<uint8_t> fallback_byte(const std::string& token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  const std::string digits = token.substr(3, 2);
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (digits[0] == '+') {
    if (hex(digits[1]) < 0) return std::nullopt;
    return static_cast<uint8_t>(hex(digits[1]));
  }
  if (hex(digits[0]) < 0 || hex(digits[1]) < 0) return std::nullopt;
  return static_cast<uint8_t>(hex(digits[0]) * 16 + hex(digits[1]));
}

void add_decoder(TokenizerImpl& t, const json& j) {
  if (j.is_null()) return;
  t.has_decoder = true;
  const std::string type = type_of(t, j, "decoder");
  if (type == "Sequence") {
    for (const json& d : j.at("decoders")) add_decoder(t, d);
  } else if (type == "Replace") {
    t.decoders.push_back([find = pattern_of(t, j.at("pattern")), c = j.at("content").get<std::string>()](
                             std::vector<std::string>& tokens) {
      for (std::string& s : tokens) replace_all(s, find(s), c);
    });
  } else if (type == "ByteFallback") {
    t.byte_fallback_decoder = true;
    t.decoders.push_back([](std::vector<std::string>& tokens) {
      std::vector<std::string> out;
      std::string bytes;
      const auto flush = [&] {
        if (bytes.empty()) return;
        if (is_valid_utf8(bytes))
          out.push_back(bytes);
        else
          out.insert(out.end(), bytes.size(), "\xEF\xBF\xBD");  // one U+FFFD per byte
        bytes.clear();
      };
      for (std::string& tok : tokens) {
        if (auto b = fallback_byte(tok)) {
          bytes += static_cast<char>(*b);
        } else {
          flush();
          out.push_back(std::move(tok));
        }
      }
      flush();
      tokens = std::move(out);
    });
  } else if (type == "Fuse") {
    t.decoders.push_back([](std::vector<std::string>& tokens) {
      std::string all;
      for (const std::string& s : tokens) all += s;
      tokens = {std::move(all)};
    });
  } else if (type == "Strip") {
    const uint32_t content = single_char(t, j.at("content"), "Strip content");
    const size_t start = count_of(t, j.at("start"), "Strip start"), stop = count_of(t, j.at("stop"), "Strip stop");
    t.decoders.push_back([content, start, stop](std::vector<std::string>& tokens) {
      for (std::string& s : tokens) {
        std::vector<size_t> offsets;  // char starts, plus the end
        std::vector<uint32_t> chars;
        for (size_t i = 0; i < s.size();) {
          const Utf8Step st = utf8_step(s, i);
          offsets.push_back(i), chars.push_back(st.code_point);
          i += st.length;
        }
        offsets.push_back(s.size());
        size_t cut_start = 0, cut_stop = chars.size();
        for (size_t i = 0; i < std::min(start, chars.size()) && chars[i] == content; ++i) cut_start = i + 1;
        for (size_t i = 0; i < std::min(stop, chars.size()) && chars[chars.size() - 1 - i] == content; ++i)
          cut_stop = chars.size() - 1 - i;
        cut_stop = std::max(cut_stop, cut_start);
        s = s.substr(offsets[cut_start], offsets[cut_stop] - offsets[cut_start]);
      }
    });
  } else if (type == "ByteLevel") {
    t.decoders.push_back([](std::vector<std::string>& tokens) {
      std::string bytes;
      for (const std::string& tok : tokens) {
        const size_t mark = bytes.size();
        bool all_mapped = true;
        for (size_t i = 0; i < tok.size() && all_mapped;) {
          const Utf8Step st = utf8_step(tok, i);
          auto b = char_to_byte(st.code_point);
          if (!st.valid || !b) all_mapped = false;
          else bytes += static_cast<char>(*b);
          i += st.length;
        }
        if (!all_mapped) bytes.replace(mark, std::string::npos, tok);  // a token outside the alphabet stays as is
      }
      tokens = {utf8_lossy(bytes)};
    });
  } else if (type == "Metaspace") {
    const uint32_t rep = single_char(t, j.at("replacement"), "Metaspace replacement");
    std::string rep_text;
    append_utf8(rep_text, rep);
    const bool strip_first = prepend_scheme_of(t, j) != PrependScheme::kNever;
    t.decoders.push_back([rep_text, strip_first](std::vector<std::string>& tokens) {
      for (size_t i = 0; i < tokens.size(); ++i)
        replace_all(tokens[i], find_literal(tokens[i], rep_text), i == 0 && strip_first ? "" : " ");
    });
  } else {
    t.fail("unsupported decoder " + type +
           " (gpulab supports Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace)");
  }
}

std::vector<int32_t> special_ids(TokenizerImpl& t, const json& j, const char* what) {
  // Bert/Roberta: ["<s>", 0]
  if (!j.is_array() || j.size() != 2) t.fail(std::string(what) + " must be [token, id]");
  const int32_t id = id_of(t, j[1], what);
  t.post_processor_ids.push_back(id);
  return {id};
}

void add_post_processor(TokenizerImpl& t, const json& j) {
  if (j.is_null()) return;
  const std::string type = type_of(t, j, "post_processor");
  if (type == "Sequence") {
    for (const json& p : j.at("processors")) add_post_processor(t, p);
  } else if (type == "ByteLevel") {
    // Only trims offsets; ids are unchanged.
  } else if (type == "TemplateProcessing") {
    // Each element of `single` is the sequence ($A, empty ids here) or a special token's ids.
    std::vector<std::optional<std::vector<int32_t>>> parts;
    const json& specials = j.at("special_tokens");
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        parts.emplace_back(std::nullopt);
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].at("id").get<std::string>();
        if (!specials.contains(name)) t.fail("TemplateProcessing uses special token " + name + " it does not define");
        const json& ids = specials[name].at("ids");
        if (!ids.is_array()) t.fail("TemplateProcessing: the ids of " + name + " are not a list");
        std::vector<int32_t> part;
        for (const json& id : ids) part.push_back(id_of(t, id, "TemplateProcessing token " + name));
        t.post_processor_ids.insert(t.post_processor_ids.end(), part.begin(), part.end());
        parts.emplace_back(std::move(part));
      } else {
        t.fail("TemplateProcessing: an element of \"single\" is neither Sequence nor SpecialToken");
      }
    }
    t.post_processors.push_back([parts](std::vector<int32_t> ids) {
      std::vector<int32_t> out;
      for (const auto& part : parts) {
        const std::vector<int32_t>& add = part ? *part : ids;
        out.insert(out.end(), add.begin(), add.end());
      }
      return out;
    });
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    const auto cls = special_ids(t, j.at("cls"), "cls"), sep = special_ids(t, j.at("sep"), "sep");
    t.post_processors.push_back([cls, sep](std::vector<int32_t> ids) {
      ids.insert(ids.begin(), cls.begin(), cls.end());
      ids.insert(ids.end(), sep.begin(), sep.end());
      return ids;
    });
  } else {
    t.fail("unsupported post_processor " + type +
           " (gpulab supports TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence)");
  }
}


void load_model(TokenizerImpl& t, const json& m) {
  if (!m.is_object()) t.fail("no \"model\" object");
  const std::string type = m.contains("type") ? m["type"].get<std::string>() : (m.contains("merges") ? "BPE" : "");
  if (type != "BPE") t.fail("unsupported model type " + (type.empty() ? std::string("(none)") : type) + " (gpulab supports BPE)");
  BpeModel& bpe = t.model;
  if (!m.contains("vocab") || !m["vocab"].is_object()) t.fail("model has no \"vocab\" object");
  bpe.vocab.reserve(m["vocab"].size());
  t.model_tokens.reserve(m["vocab"].size());
  for (const auto& [token, id] : m["vocab"].items()) {
    const int32_t i = id_of(t, id, "vocab entry " + token);
    bpe.vocab[token] = i;
    t.model_tokens[i] = token;
  }
  bpe.continuing_subword_prefix = m.value("continuing_subword_prefix", json()).is_string()
                                      ? m["continuing_subword_prefix"].get<std::string>() : "";
  bpe.end_of_word_suffix =
      m.value("end_of_word_suffix", json()).is_string() ? m["end_of_word_suffix"].get<std::string>() : "";
  bpe.fuse_unk = m.value("fuse_unk", false);
  bpe.byte_fallback = m.value("byte_fallback", false);
  bpe.ignore_merges = m.value("ignore_merges", false);
  bpe.index_byte_tokens();
  // dropout only regularizes training; encoding here is always the deterministic one.
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    const std::string unk = m["unk_token"].get<std::string>();
    auto it = bpe.vocab.find(unk);
    if (it == bpe.vocab.end()) t.fail("unk_token " + unk + " is not in the vocabulary");
    bpe.unk_id = it->second;
  }
  static const json kNoMerges = json::array();
  const json& merges = m.contains("merges") ? m["merges"] : kNoMerges;
  if (!merges.is_array()) t.fail("model \"merges\" is not an array");
  bpe.reserve_merges(merges.size());
  const size_t prefix_len = bpe.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& mj = merges[rank];
    std::string a, b;
    if (mj.is_string()) {
      const std::string s = mj.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) t.fail("merge " + std::to_string(rank) + " (\"" + s + "\") is not \"a b\"");
      a = s.substr(0, space), b = s.substr(space + 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0].get<std::string>(), b = mj[1].get<std::string>();
    } else {
      t.fail("merge " + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const std::string merged = a + (prefix_len && b.starts_with(bpe.continuing_subword_prefix) ? b.substr(prefix_len) : b);
    const auto ia = bpe.vocab.find(a), ib = bpe.vocab.find(b), im = bpe.vocab.find(merged);
    if (ia == bpe.vocab.end() || ib == bpe.vocab.end() || im == bpe.vocab.end())
      t.fail("merge " + std::to_string(rank) + " (" + a + " " + b + ") uses a token not in the vocabulary");
    bpe.add_merge(ia->second, ib->second, static_cast<int32_t>(rank), im->second);
  }
}

void load_added_tokens(TokenizerImpl& t, const json& list) {
  if (list.is_null()) return;
  if (!list.is_array()) t.fail("\"added_tokens\" is not an array");
  t.added.reserve(list.size());  // pointers into `added` are kept by the maps below
  for (const json& a : list) {
    const std::string content = a.at("content").get<std::string>();
    const bool special = a.value("special", false), normalized = a.value("normalized", !special);
    std::string text = content;
    if (normalized) t.normalize(text);
    t.added.push_back({content, id_of(t, a.at("id"), "added token " + content), special,
                       a.value("single_word", false), a.value("lstrip", false), a.value("rstrip", false), normalized,
                       std::move(text)});
  }
  for (const AddedToken& tok : t.added) {
    t.added_by_text[tok.content] = tok.id;
    t.added_by_id[tok.id] = &tok;
    (tok.normalized ? t.normalized_matcher : t.raw_matcher).add(tok.text, &tok);
  }
}

}  // namespace

std::vector<int32_t> TokenizerImpl::encode(std::string_view text, bool add_special) const {
  Pieces pieces{{std::string(text), -1, true}};
  split_added(pieces, raw_matcher, word_char);
  for (Piece& p : pieces)
    if (p.id < 0) normalize(p.text);
  split_added(pieces, normalized_matcher, word_char);
  std::erase_if(pieces, [](const Piece& p) { return p.text.empty(); });
  for (const PreTokenizer& pre : pre_tokenizers) pre(pieces);
  std::vector<int32_t> ids;
  for (const Piece& p : pieces) {
    if (p.id >= 0)
      ids.push_back(p.id);
    else
      model.encode(p.text, ids);
  }
  if (add_special)
    for (const PostProcessor& post : post_processors) ids = post(std::move(ids));
  return ids;
}

std::string TokenizerImpl::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto a = added_by_id.find(id); a != added_by_id.end()) {
      if (!(skip_special && a->second->special)) tokens.push_back(a->second->text);
    } else if (auto m = model_tokens.find(id); m != model_tokens.end()) {
      tokens.push_back(m->second);
    }
  }
  std::string out;
  if (!has_decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const Decoder& d : decoders) d(tokens);
  for (const std::string& s : tokens) out += s;
  return out;
}

}  // namespace detail

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file = fs::is_directory(path, ec) ? path / "tokenizer.json" : path;
  auto impl = std::make_shared<detail::TokenizerImpl>();
  impl->file = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in || fs::is_directory(file, ec)) impl->fail("no such file (a tokenizer.json, or a folder holding one)");
  // The largest real tokenizer.json files are tens of MB; this catches a checkpoint given by mistake.
  constexpr uintmax_t kMaxBytes = uintmax_t{1} << 30;
  if (const uintmax_t size = fs::file_size(file, ec); !ec && size > kMaxBytes)
    impl->fail("is " + std::to_string(size >> 20) + " MiB, too large to be a tokenizer.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    impl->fail("malformed JSON: " + detail::utf8_lossy(e.what()));  // the message may quote binary bytes
  }
  try {
    if (!j.is_object()) impl->fail("not a tokenizer.json (the top level is not an object)");
    if (!j.contains("model")) impl->fail("no \"model\"");
    detail::load_model(*impl, j["model"]);
    detail::add_normalizer(*impl, j.value("normalizer", nlohmann::json()));
    detail::load_added_tokens(*impl, j.value("added_tokens", nlohmann::json()));
    detail::add_pre_tokenizer(*impl, j.value("pre_tokenizer", nlohmann::json()));
    detail::add_decoder(*impl, j.value("decoder", nlohmann::json()));
    detail::add_post_processor(*impl, j.value("post_processor", nlohmann::json()));
  } catch (const nlohmann::json::exception& e) {
    impl->fail(std::string("unexpected content: ") + e.what());
  } catch (const std::invalid_argument& e) {
    impl->fail(e.what());
  }
  int32_t max_id = -1;
  for (const auto& [id, _] : impl->model_tokens) max_id = std::max(max_id, id);
  for (const auto& tok : impl->added) max_id = std::max(max_id, tok.id);
  impl->vocab_size = max_id + 1;
  for (int32_t id : impl->post_processor_ids)
    if (id >= impl->vocab_size)
      impl->fail("post_processor adds id " + std::to_string(id) + ", beyond the vocabulary (" +
                 std::to_string(impl->vocab_size) + " ids)");
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  return impl_->encode(text, add_special);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  return impl_->decode(ids, skip_special);
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added_by_text.find(key); it != impl_->added_by_text.end()) return it->second;
  if (auto it = impl_->model.vocab.find(key); it != impl_->model.vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return it->second->text;
  if (auto it = impl_->model_tokens.find(id); it != impl_->model_tokens.end()) return it->second;
  throw core::InputError(impl_->file + ": no token has id " + std::to_string(id));
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && it->second->special;
}

bool Tokenizer::ends_in_byte_run(std::span<const int32_t> ids) const {
  // ByteFallback decodes a run of <0xNN> tokens as a whole: one invalid byte later in the run
  // turns the run's earlier, valid characters into U+FFFD too (found by fuzz_tokenizer_encode).
  if (!impl_->byte_fallback_decoder || ids.empty()) return false;
  const auto last = impl_->model_tokens.find(ids.back());
  return last != impl_->model_tokens.end() && detail::fallback_byte(last->second).has_value();
}

std::string Tokenizer::decode_stream(std::span<const int32_t> ids, StreamState& state, bool skip_special,
                                     bool flush) const {
  // As in `tokenizers`' DecodeStream: decode a window that starts a few tokens back, so that
  // decoders which look at neighbours (Strip, Metaspace, byte runs) see the same context.
  const size_t n = ids.size();
  if (state.read_begin > n || state.prefix_begin > state.read_begin) state = {};
  const std::string prefix = decode(ids.subspan(state.prefix_begin, state.read_begin - state.prefix_begin), skip_special);
  const std::string full = decode(ids.subspan(state.prefix_begin), skip_special);
  if (full.size() <= prefix.size() || (!flush && detail::ends_with_replacement_char(full))) return "";
  if (!flush && ends_in_byte_run(ids)) return "";
  state.prefix_begin = state.read_begin;
  state.read_begin = n;
  return full.substr(prefix.size());
}

}  // namespace gpulab::llm
