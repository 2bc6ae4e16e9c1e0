#include "llm/nfc.h"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "llm/tokenizer_text.h"

namespace gpulab::llm::detail {

namespace {

// Hangul syllables compose and decompose by arithmetic (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint32_t combining_class(uint32_t cp) {
  if (cp < kNfcQuickLimit) return 0;
  auto it = std::lower_bound(kCombiningClasses.begin(), kCombiningClasses.end(), cp,
                             [](const auto& row, uint32_t c) { return row[0] < c; });
  return it != kCombiningClasses.end() && (*it)[0] == cp ? (*it)[1] : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(kDecompositions.begin(), kDecompositions.end(), cp,
                             [](const auto& row, uint32_t c) { return row[0] < c; });
  if (it == kDecompositions.end() || (*it)[0] != cp) return out.push_back(cp);
  decompose((*it)[1], out);
  if ((*it)[2]) decompose((*it)[2], out);
}

// The primary composite of a starter and the next character, or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const std::array<uint32_t, 3> key{a, b, 0};
  auto it = std::lower_bound(kCompositions.begin(), kCompositions.end(), key, [](const auto& row, const auto& k) {
    return row[0] != k[0] ? row[0] < k[0] : row[1] < k[1];
  });
  return it != kCompositions.end() && (*it)[0] == a && (*it)[1] == b ? (*it)[2] : 0;
}

// Canonical ordering: each run of non-starters (class > 0) sorted stably by class, `cls` beside
// `d`. A stable sort per run costs n log n for n marks; the insertion sort used before took 15.6 s
// for a run of 160,000 marks of alternating classes (320 KB: a prompt well under serve's body
// limit).
void canonical_order(std::vector<uint32_t>& d, std::vector<uint32_t>& cls) {
  std::vector<std::pair<uint32_t, uint32_t>> run;  // {class, code point}
  for (size_t begin = 0; begin < d.size();) {
    size_t end = begin;
    while (end < d.size() && cls[end] != 0) ++end;
    if (end - begin > 1) {
      run.clear();
      for (size_t i = begin; i < end; ++i) run.emplace_back(cls[i], d[i]);
      std::stable_sort(run.begin(), run.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t i = begin; i < end; ++i) std::tie(cls[i], d[i]) = run[i - begin];
    }
    begin = end == begin ? end + 1 : end;
  }
}

// NFC of a run of code points: decompose, order marks by class, compose (UAX #15's sample).
void nfc_run(std::vector<uint32_t>& cps, std::string& out) {
  std::vector<uint32_t> d;
  d.reserve(cps.size() * 2);
  for (uint32_t cp : cps) decompose(cp, d);
  std::vector<uint32_t> cls(d.size());
  for (size_t i = 0; i < d.size(); ++i) cls[i] = combining_class(d[i]);
  canonical_order(d, cls);
  if (!d.empty()) {
    size_t starter = 0, kept = 1;
    uint32_t last_class = cls[0] ? 256 : 0;
    for (size_t i = 1; i < d.size(); ++i) {
      const uint32_t composite = compose(d[starter], d[i]);
      if (composite && (last_class < cls[i] || last_class == 0)) {
        d[starter] = composite;
        continue;
      }
      if (cls[i] == 0) starter = kept;
      last_class = cls[i];
      d[kept++] = d[i];
    }
    d.resize(kept);
  }
  for (uint32_t cp : d) append_utf8(out, cp);
  cps.clear();
}

}  // namespace

std::string nfc(std::string_view text) {
  bool quick = true;
  for (size_t i = 0; i < text.size() && quick;) {
    const Utf8Step st = utf8_step(text, i);
    quick = st.valid && st.code_point < kNfcQuickLimit;
    i += st.length;
  }
  if (quick) return std::string(text);
  std::string out;
  out.reserve(text.size());
  std::vector<uint32_t> run;
  for (size_t i = 0; i < text.size();) {
    const Utf8Step st = utf8_step(text, i);
    if (st.valid) {
      run.push_back(st.code_point);
    } else {
      nfc_run(run, out);
      out.append(text.substr(i, st.length));
    }
    i += st.length;
  }
  nfc_run(run, out);
  return out;
}

}  // namespace gpulab::llm::detail
