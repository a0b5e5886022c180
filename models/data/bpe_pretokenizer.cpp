#include "models/data/bpe_pretokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf16.h>

#include <cstdio>
#include <optional>

#include "framework/core/error.h"
#include "models/data/unicode_categories.h"

namespace cpf::models::data {

std::string pretokenizer_unicode_version() { return kBundledUnicodeVersion; }

std::string icu_unicode_version() {
  UVersionInfo version;
  u_getUnicodeVersion(version);
  std::string text = std::to_string(version[0]);
  for (int part = 1; part < 3; ++part) {
    if (part == 2 && version[2] == 0) break;
    text += '.';
    text += std::to_string(version[part]);
  }
  return text;
}

namespace {

// An ICU set of `ranges`, negated when asked: "[\x{41}-\x{5A}\x{61}-\x{7A}...]". Inside a bracket
// expression ICU takes a nested set as a union, so the text fits there as well as on its own.
std::string icu_set(const std::vector<CodePointRange>& ranges, bool negated) {
  std::string out = negated ? "[^" : "[";
  char hex[16];
  const auto code_point = [&](char32_t cp) {
    std::snprintf(hex, sizeof(hex), "\\x{%X}", static_cast<unsigned>(cp));
    out += hex;
  };
  for (const CodePointRange& r : ranges) {
    code_point(r.first);
    if (r.last == r.first) continue;
    out += '-';
    code_point(r.last);
  }
  return out + "]";
}

// The property escape at pattern[i] ('\' then 'p' or 'P'), if it names a General_Category: its
// length in `length` and the set it means. \pL, \p{L}, \P{L}, \p{^L} (Oniguruma's negation, which ICU
// lacks: \p{^Han} becomes \P{Han}).
std::optional<std::string> category_escape(const std::string& pattern, size_t i, size_t& length) {
  bool negated = pattern[i + 1] == 'P';
  std::string name;
  if (i + 2 < pattern.size() && pattern[i + 2] == '{') {
    const size_t close = pattern.find('}', i + 3);
    if (close == std::string::npos) return std::nullopt;  // ICU reports the malformed escape
    name = pattern.substr(i + 3, close - i - 3);
    length = close + 1 - i;
  } else if (i + 2 < pattern.size()) {
    name = pattern.substr(i + 2, 1);
    length = 3;
  } else {
    return std::nullopt;
  }
  const bool caret = !name.empty() && name[0] == '^';
  if (caret) negated = !negated, name.erase(0, 1);
  const std::optional<std::vector<CodePointRange>> ranges = general_category_ranges(name);
  if (ranges) return icu_set(*ranges, negated);
  // Another property (a script, a binary property): ICU's own, with Oniguruma's \p{^X} spelled \P{X}.
  if (caret) return std::string(negated ? "\\P{" : "\\p{") + name + "}";
  return std::nullopt;
}

// The pattern ICU runs: \s -> \p{White_Space}, \S -> \P{White_Space}, and General_Category escapes
// (\p{L}, \p{N}, ...) -> explicit sets from the bundled Unicode 16.0 table. Other escapes (\\s and
// \p{Han} included) are kept as they are.
std::string icu_pattern(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char next = pattern[i + 1];
    size_t length = 0;
    if (next == 's' || next == 'S') {
      out += next == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
      ++i;
    } else if (next == 'p' || next == 'P') {
      if (const std::optional<std::string> set = category_escape(pattern, i, length)) {
        out += *set;
        i += length - 1;
      } else {
        out += pattern.substr(i, 2);
        ++i;
      }
    } else {
      out += pattern.substr(i, 2);
      ++i;
    }
  }
  return out;
}

// Length of the valid UTF-8 sequence at text[i] and its code point, or 0 when the bytes there are not
// valid UTF-8 (overlong forms, surrogates and values above U+10FFFF included).
int utf8_sequence(std::string_view text, size_t i, UChar32& cp) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  int length;
  UChar32 min;
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    length = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + static_cast<size_t>(length) > text.size()) return 0;
  for (int k = 1; k < length; ++k) {
    const unsigned char b = byte(i + static_cast<size_t>(k));
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return length;
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  CPF_CHECK(U_SUCCESS(status), "tokenizer: ICU has no NFC normalizer (", u_errorName(status), ")");
  std::string out;
  size_t run_begin = 0;  // start of the current valid run
  const auto flush = [&](size_t end) {
    if (end == run_begin) return;
    const icu::UnicodeString run = icu::UnicodeString::fromUTF8(text.substr(run_begin, end - run_begin));
    const icu::UnicodeString normalized = nfc->normalize(run, status);
    CPF_CHECK(U_SUCCESS(status), "tokenizer: NFC normalization failed (", u_errorName(status), ")");
    normalized.toUTF8String(out);
  };
  for (size_t i = 0; i < text.size();) {
    UChar32 cp = 0;
    const int length = utf8_sequence(text, i, cp);
    if (length > 0) {
      i += static_cast<size_t>(length);
      continue;
    }
    flush(i);
    out += text[i];  // an invalid byte stays itself
    run_begin = ++i;
  }
  flush(text.size());
  return out;
}

struct BpePreTokenizer::Compiled {
  std::unique_ptr<icu::RegexPattern> regex;
};

BpePreTokenizer::BpePreTokenizer(const std::string& pattern)
    : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError where{};
  const icu::UnicodeString source = icu::UnicodeString::fromUTF8(icu_pattern(pattern));
  compiled_->regex.reset(icu::RegexPattern::compile(source, 0, where, status));
  if (U_SUCCESS(status) && compiled_->regex) return;
  // The offset is the rewritten pattern's; the pattern as given (ICU reads \p{L} too) usually fails at the
  // same place, and its offset is the one the user can find.
  UErrorCode original_status = U_ZERO_ERROR;
  UParseError original_where{};
  const std::unique_ptr<icu::RegexPattern> original(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, original_where, original_status));
  if (U_FAILURE(original_status)) status = original_status, where = original_where;
  CPF_FAIL("tokenizer: the pre-tokenizer pattern ", pattern, " does not compile (", u_errorName(status),
           " near offset ", where.offset, ")");
}

BpePreTokenizer::~BpePreTokenizer() = default;

std::vector<std::string_view> BpePreTokenizer::split(std::string_view text) const {
  // UTF-16 for ICU, with the byte offset of every UTF-16 unit (and of the end).
  icu::UnicodeString units;
  std::vector<size_t> byte_at;
  byte_at.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    UChar32 cp = 0;
    int length = utf8_sequence(text, i, cp);
    if (length == 0) cp = 0xFFFD, length = 1;
    units.append(cp);
    for (int k = 0; k < U16_LENGTH(cp); ++k) byte_at.push_back(i);
    i += static_cast<size_t>(length);
  }
  byte_at.push_back(text.size());

  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(compiled_->regex->matcher(units, status));
  CPF_CHECK(U_SUCCESS(status), "tokenizer: cannot run the pre-tokenizer pattern (", u_errorName(status), ")");
  std::vector<std::string_view> pieces;
  size_t covered = 0;  // bytes already in pieces
  const auto add = [&](size_t begin, size_t end) {
    if (end > begin) pieces.push_back(text.substr(begin, end - begin));
  };
  while (matcher->find(status) && U_SUCCESS(status)) {
    const size_t begin = byte_at[static_cast<size_t>(matcher->start(status))];
    const size_t end = byte_at[static_cast<size_t>(matcher->end(status))];
    add(covered, begin);  // text the pattern skipped
    add(begin, end);
    covered = std::max(covered, end);
  }
  CPF_CHECK(U_SUCCESS(status), "tokenizer: the pre-tokenizer pattern failed on the input (", u_errorName(status), ")");
  add(covered, text.size());
  return pieces;
}

}  // namespace cpf::models::data
