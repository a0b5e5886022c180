#pragma once
// The regex pre-tokenizer of byte-level BPE tokenizers: text is cut into pieces (GPT-2: words with
// their leading space, runs of digits, runs of punctuation, whitespace), and BPE never merges across
// two pieces. Patterns use the Perl/Oniguruma syntax of tiktoken and Hugging Face (\p{L}, \p{N},
// (?!\S), (?i:...), possessive quantifiers) and run on ICU's backtracking regex engine.
//
// `\s` and `\S` are rewritten to the Unicode White_Space property, which is what tiktoken's regex
// crate and Oniguruma mean by them (ICU's own \s omits U+000B and U+0085). General_Category escapes
// (\p{L}, \p{N}, \P{L}, \pL, \p{Lu}, ...) become explicit sets from the bundled Unicode 16.0 table,
// so letters assigned after the linked ICU's Unicode version are letters, as for tiktoken. Other classes
// (\d, \w, \b, [:alpha:], scripts such as \p{Han}; \p{^Han} is read as \P{Han}) keep ICU's tables. A compile error
// names the offset in the pattern as given.
//
// Text is bytes: valid UTF-8 is matched as its code points; each byte that is not part of valid UTF-8
// is matched as U+FFFD (a symbol, so GPT-2's pattern groups it with punctuation) but stays that byte
// in the piece. Pieces cover the text exactly (the parts a pattern does not match become pieces of
// their own), so concatenating them gives the input back.
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include "models/data/deprecated_namespace.h"

namespace cpf::models::data {

// GPT-2's pattern (openai/gpt-2 encoder.py, tiktoken's r50k/gpt2).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Unicode NFC of the valid UTF-8 runs of `text` (Hugging Face's "NFC" normalizer, GPT-NeoX and Pythia
// use it); bytes that are not valid UTF-8 are kept as they are.
std::string nfc_normalize(std::string_view text);

// The Unicode version of the General_Category classes of the patterns (\p{L}, \p{N}, \p{Lu}, ...):
// "16.0", the bundled table (models/data/unicode_categories.h), the version tiktoken's regex crate has.
std::string pretokenizer_unicode_version();
// The Unicode version of the ICU the build links ("15.0" with Debian 12's ICU 72): White_Space, NFC and
// the properties that are no General_Category (\p{Han}, \p{Alphabetic}) come from its tables.
std::string icu_unicode_version();

class BpePreTokenizer {
 public:
  // Throws cpf::Error naming the pattern and ICU's complaint when it does not compile.
  explicit BpePreTokenizer(const std::string& pattern);
  ~BpePreTokenizer();
  BpePreTokenizer(const BpePreTokenizer&) = delete;
  BpePreTokenizer& operator=(const BpePreTokenizer&) = delete;

  const std::string& pattern() const { return pattern_; }
  // The pieces of `text`, in order, as views into it.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace cpf::models::data
