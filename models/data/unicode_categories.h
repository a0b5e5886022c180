#pragma once
// Unicode General_Category from a table bundled with the library (data/unicode/general_category.txt,
// Unicode 16.0, the version of the tables in tiktoken's regex crate), so the pre-tokenizer's \p{L},
// \p{N}, ... classes are the same whatever ICU the build links (Debian 12's ICU 72 knows Unicode 15.0
// only, and calls every character assigned since then unassigned: neither letter nor number).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cpf::models::data {

// The Unicode version of the bundled table.
inline constexpr const char* kBundledUnicodeVersion = "16.0";

struct CodePointRange {
  char32_t first = 0;
  char32_t last = 0;  // inclusive
  bool operator==(const CodePointRange&) const = default;
};

// The two-letter General_Category of `cp` ("Lu", "Nd", ...); "Cn" when it is unassigned or above U+10FFFF.
std::string general_category(char32_t cp);

// The code points of a General_Category value or group, sorted and merged: short or long names as in
// Unicode's PropertyValueAliases ("L" / "Letter", "Lu" / "Uppercase_Letter", "LC" / "L&" / "Cased_Letter",
// "N" / "Number", "Cn" / "Unassigned", ...), matched loosely as Unicode's UAX44-LM3 says (case, spaces,
// '_' and '-' ignored), optionally prefixed "gc=" or "General_Category=". nullopt when `name` is no
// General_Category (a script, a binary property): those are left to ICU.
std::optional<std::vector<CodePointRange>> general_category_ranges(std::string_view name);

}  // namespace cpf::models::data
