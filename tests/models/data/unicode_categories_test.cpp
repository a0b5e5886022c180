// The bundled Unicode 16.0 General_Category table and the pre-tokenizer classes built from it.
//
// The whole-range oracle is tiktoken 0.14 (its regex crate has Unicode 16.0 tables), probed once in a
// throwaway virtual environment outside the repository: with GPT-2's pattern and a rank table of the
// 256 bytes plus the pairs "A"+byte and "1"+byte, `encode_ordinary("A" + chr(c))` starts with a pair
// token exactly when c joins the letter run (c is \p{L}), and likewise "1" + chr(c) for \p{N}. Over all
// code points but the surrogates that gave 141,028 letters and 1,911 numbers; kTiktokenLetters and
// kTiktokenNumbers are the count and the FNV-1a 64 hash of each sorted list (every code point as 4
// little-endian bytes). The same lists equal unicodedata2 16.0.0's categories L* and N*.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "framework/core/error.h"
#include "models/data/bpe_pretokenizer.h"
#include "models/data/unicode_categories.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {

struct CodePointList {
  size_t count;
  uint64_t fnv1a;
};
constexpr CodePointList kTiktokenLetters{141028, 0xf41bf72239455b4fULL};
constexpr CodePointList kTiktokenNumbers{1911, 0xd15586ee8a145a41ULL};

struct Hash {
  size_t count = 0;
  uint64_t h = 0xcbf29ce484222325ULL;
  void add(char32_t cp) {
    ++count;
    for (int k = 0; k < 4; ++k) h = (h ^ ((cp >> (8 * k)) & 0xFF)) * 0x100000001b3ULL;
  }
};

std::string utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

size_t size_of(const std::vector<CodePointRange>& ranges) {
  size_t n = 0;
  for (const CodePointRange& r : ranges) n += r.last - r.first + 1;
  return n;
}

TEST(UnicodeCategories, KnowsCharactersOfUnicode16) {
  EXPECT_EQ(general_category(U'A'), "Lu");
  EXPECT_EQ(general_category(U'7'), "Nd");
  EXPECT_EQ(general_category(U' '), "Zs");
  EXPECT_EQ(general_category(0x13460), "Lo") << "Egyptian Hieroglyphs Extended-A, new in 16.0";
  EXPECT_EQ(general_category(0x1C89), "Lu") << "Cyrillic capital Tje, new in 16.0";
  EXPECT_EQ(general_category(0x16D70), "Nd") << "Kirat Rai digit zero, new in 16.0";
  EXPECT_EQ(general_category(0x0558), "Cn") << "assigned only in a later version";
  EXPECT_EQ(general_category(0xE000), "Co");
  EXPECT_EQ(general_category(0xD800), "Cs");
  EXPECT_EQ(general_category(0x10FFFF), "Cn");
  EXPECT_EQ(general_category(0x110000), "Cn");
}

TEST(UnicodeCategories, LettersAndNumbersAreTiktoksSets) {
  for (const auto& [name, expected] : {std::pair{"L", kTiktokenLetters}, std::pair{"N", kTiktokenNumbers}}) {
    Hash hash;
    const std::vector<CodePointRange> ranges = general_category_ranges(name).value();
    for (const CodePointRange& r : ranges) {
      for (char32_t c = r.first; c <= r.last; ++c) hash.add(c);
    }
    EXPECT_EQ(hash.count, expected.count) << name;
    EXPECT_EQ(hash.h, expected.fnv1a) << name;
  }
}

TEST(UnicodeCategories, ValuesPartitionTheCodeSpaceAndGroupsAreTheirUnions) {
  const std::vector<std::string> values = {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl",
                                           "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc",
                                           "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"};
  size_t total = 0;
  for (const std::string& v : values) {
    const std::vector<CodePointRange> ranges = general_category_ranges(v).value();
    total += size_of(ranges);
    for (const CodePointRange& r : ranges) {
      EXPECT_EQ(general_category(r.first), v);
      EXPECT_EQ(general_category(r.last), v);
    }
  }
  EXPECT_EQ(total, 0x110000u) << "every code point has exactly one value";
  for (const char* group : {"L", "M", "N", "P", "S", "Z", "C"}) {
    size_t members = 0;
    for (const std::string& v : values) {
      if (v[0] == group[0]) members += size_of(general_category_ranges(v).value());
    }
    EXPECT_EQ(size_of(general_category_ranges(group).value()), members) << group;
  }
  EXPECT_EQ(size_of(general_category_ranges("LC").value()), size_of(general_category_ranges("Lu").value()) +
                                                                size_of(general_category_ranges("Ll").value()) +
                                                                size_of(general_category_ranges("Lt").value()));
}

TEST(UnicodeCategories, NamesMatchLooselyAndOthersAreLeftToIcu) {
  const std::vector<CodePointRange> letters = general_category_ranges("L").value();
  for (const char* name : {"Letter", "letter", "l", "gc=L", "General_Category=Letter", "general category = letter"}) {
    EXPECT_EQ(general_category_ranges(name), letters) << name;
  }
  EXPECT_EQ(general_category_ranges("L&"), general_category_ranges("Cased_Letter"));
  EXPECT_EQ(general_category_ranges("digit"), general_category_ranges("Nd"));
  for (const char* other : {"Han", "Alphabetic", "White_Space", "Lx", ""}) {
    EXPECT_FALSE(general_category_ranges(other).has_value()) << other;
  }
}

// Through the pre-tokenizer over the whole code space: "A" + c is one piece of GPT-2's pattern exactly
// when c is a letter for tiktoken, "1" + c when c is a number.
TEST(UnicodeCategories, Gpt2PatternClassesEqualTiktokensOnEveryCodePoint) {
  const BpePreTokenizer gpt2(kGpt2Pattern);
  Hash letters, numbers;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;  // no UTF-8 form
    const std::string s = utf8(c);
    if (gpt2.split("A" + s).size() == 1) letters.add(c);
    if (gpt2.split("1" + s).size() == 1) numbers.add(c);
  }
  EXPECT_EQ(letters.count, kTiktokenLetters.count);
  EXPECT_EQ(letters.h, kTiktokenLetters.fnv1a);
  EXPECT_EQ(numbers.count, kTiktokenNumbers.count);
  EXPECT_EQ(numbers.h, kTiktokenNumbers.fnv1a);
}

TEST(UnicodeCategories, EveryEscapeFormIsRewritten) {
  const std::string tje = "\u1C89";  // a letter of 16.0 only
  const auto pieces = [](const std::string& pattern, const std::string& text) {
    return BpePreTokenizer(pattern).split(text).size();
  };
  for (const char* letter : {R"(\p{L}+)", R"(\pL+)", R"(\p{Letter}+)", R"(\p{Lu}+)", R"([\p{L}]+)", R"(\P{^L}+)"}) {
    EXPECT_EQ(pieces(letter, "A" + tje + "B"), 1u) << letter;
  }
  for (const char* not_letter : {R"(\P{L}+)", R"(\p{^L}+)", R"([^\p{L}]+)"}) {
    EXPECT_EQ(pieces(not_letter, "1" + tje + "2"), 3u) << not_letter;
  }
  EXPECT_EQ(pieces(R"(\\p\{L\}|\p{L})", "\\p{L}"), 1u) << "an escaped backslash is no escape";
  EXPECT_EQ(pieces(R"(\p{Han}+)", "\u4E00\u4E01"), 1u) << "a script is left to ICU";
  EXPECT_EQ(pieces(R"(\p{^Han}+)", "ab\u4E00cd"), 3u) << "Oniguruma's negation of a script, spelled for ICU";
}

TEST(UnicodeCategories, ACompileErrorNamesTheOffsetInThePatternAsGiven) {
  // The error is after a \p{L}, which the rewritten pattern spells as some 10 KB of ranges.
  EXPECT_CPF_ERROR(BpePreTokenizer(R"(\p{L}+(ab)"), "does not compile (U_REGEX_MISMATCHED_PAREN near offset 9)");
}

TEST(UnicodeCategories, MalformedPropertyEscapesAreRefusedByName) {
  for (const char* bad : {R"(\p{L)", R"(\p{NoSuchProperty})", R"(a\p)"}) {
    try {
      BpePreTokenizer tokenizer(bad);
      ADD_FAILURE() << bad << " compiled";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("pattern ") + bad + " does not compile"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace cpf::models::data
