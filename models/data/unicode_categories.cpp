#include "models/data/unicode_categories.h"

#include <algorithm>
#include <array>
#include <charconv>

#include "framework/core/error.h"
#include "models/data/embedded_file.h"

// The table is assembled into .rodata (models/data/embedded_file.h; CPF_UNICODE_DIR is set by
// models/CMakeLists.txt).
__asm__(CPF_EMBED_FILE(cpf_unicode_general_category, CPF_UNICODE_DIR "/general_category.txt"));
CPF_DECLARE_EMBEDDED(cpf_unicode_general_category)

namespace cpf::models::data {
namespace {

struct CategoryRange {
  char32_t first;
  char32_t last;
  std::array<char, 2> category;
};

char32_t parse_code_point(std::string_view hex, std::string_view line) {
  uint32_t value = 0;
  const auto [end, error] = std::from_chars(hex.data(), hex.data() + hex.size(), value, 16);
  CPF_CHECK(error == std::errc() && end == hex.data() + hex.size() && value <= 0x10FFFF,
            "unicode table: bad code point in line '", std::string(line), "'");
  return static_cast<char32_t>(value);
}

// "0041..005A;Lu" or "00AA;Lo"; '#' lines are comments. Ranges are sorted and disjoint.
std::vector<CategoryRange> parse_table(std::string_view text) {
  std::vector<CategoryRange> table;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t semicolon = line.find(';');
    CPF_CHECK(semicolon != std::string_view::npos && line.size() == semicolon + 3, "unicode table: bad line '",
              std::string(line), "'");
    const std::string_view points = line.substr(0, semicolon);
    const size_t dots = points.find("..");
    CategoryRange range{};
    range.first = parse_code_point(points.substr(0, dots), line);
    range.last = dots == std::string_view::npos ? range.first : parse_code_point(points.substr(dots + 2), line);
    range.category = {line[semicolon + 1], line[semicolon + 2]};
    CPF_CHECK(range.first <= range.last && (table.empty() || table.back().last < range.first), "unicode table: line '",
              std::string(line), "' is out of order");
    table.push_back(range);
  }
  return table;
}

const std::vector<CategoryRange>& table() {
  static const std::vector<CategoryRange> parsed =
      parse_table({cpf_unicode_general_category_begin,
                   static_cast<size_t>(cpf_unicode_general_category_end - cpf_unicode_general_category_begin)});
  return parsed;
}

// Lowercase, without ' ', '_' and '-' (UAX44-LM3).
std::string loose(std::string_view name) {
  std::string out;
  for (const char c : name) {
    if (c == ' ' || c == '_' || c == '-') continue;
    out += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  return out;
}

struct CategoryName {
  const char* short_name;  // a value ("Lu") or a group ("L", "LC"): the categories whose name starts so
  const char* long_name;
  const char* alias;  // another long name, or ""
};

constexpr std::array<CategoryName, 38> kNames{{
    {"L", "Letter", ""},
    {"LC", "Cased_Letter", "L&"},
    {"Lu", "Uppercase_Letter", ""},
    {"Ll", "Lowercase_Letter", ""},
    {"Lt", "Titlecase_Letter", ""},
    {"Lm", "Modifier_Letter", ""},
    {"Lo", "Other_Letter", ""},
    {"M", "Mark", "Combining_Mark"},
    {"Mn", "Nonspacing_Mark", ""},
    {"Mc", "Spacing_Mark", ""},
    {"Me", "Enclosing_Mark", ""},
    {"N", "Number", ""},
    {"Nd", "Decimal_Number", "digit"},
    {"Nl", "Letter_Number", ""},
    {"No", "Other_Number", ""},
    {"P", "Punctuation", "punct"},
    {"Pc", "Connector_Punctuation", ""},
    {"Pd", "Dash_Punctuation", ""},
    {"Ps", "Open_Punctuation", ""},
    {"Pe", "Close_Punctuation", ""},
    {"Pi", "Initial_Punctuation", ""},
    {"Pf", "Final_Punctuation", ""},
    {"Po", "Other_Punctuation", ""},
    {"S", "Symbol", ""},
    {"Sm", "Math_Symbol", ""},
    {"Sc", "Currency_Symbol", ""},
    {"Sk", "Modifier_Symbol", ""},
    {"So", "Other_Symbol", ""},
    {"Z", "Separator", ""},
    {"Zs", "Space_Separator", ""},
    {"Zl", "Line_Separator", ""},
    {"Zp", "Paragraph_Separator", ""},
    {"C", "Other", ""},
    {"Cc", "Control", "cntrl"},
    {"Cf", "Format", ""},
    {"Cs", "Surrogate", ""},
    {"Co", "Private_Use", ""},
    {"Cn", "Unassigned", ""},
}};

bool in_group(const std::array<char, 2>& category, std::string_view group) {
  if (group == "LC") return category[0] == 'L' && (category[1] == 'u' || category[1] == 'l' || category[1] == 't');
  return category[0] == group[0] && (group.size() == 1 || category[1] == group[1]);
}

void append_merged(std::vector<CodePointRange>& out, char32_t first, char32_t last) {
  if (!out.empty() && out.back().last + 1 == first) {
    out.back().last = last;
  } else {
    out.push_back({first, last});
  }
}

// Every code point no table line covers (Cn), merged into `out` in order with the table's ranges.
std::vector<CodePointRange> ranges_of(std::string_view group) {
  std::vector<CodePointRange> out;
  const bool unassigned = group == "C" || group == "Cn";
  char32_t next = 0;  // the first code point not yet walked
  for (const CategoryRange& r : table()) {
    if (unassigned && r.first > next) append_merged(out, next, r.first - 1);
    if (in_group(r.category, group)) append_merged(out, r.first, r.last);
    next = r.last + 1;
  }
  if (unassigned && next <= 0x10FFFF) append_merged(out, next, 0x10FFFF);
  return out;
}

}  // namespace

std::string general_category(char32_t cp) {
  const std::vector<CategoryRange>& t = table();
  const auto it =
      std::upper_bound(t.begin(), t.end(), cp, [](char32_t value, const CategoryRange& r) { return value < r.first; });
  if (it == t.begin() || std::prev(it)->last < cp) return "Cn";
  return {std::prev(it)->category.begin(), std::prev(it)->category.end()};
}

std::optional<std::vector<CodePointRange>> general_category_ranges(std::string_view name) {
  std::string key = loose(name);
  for (const char* prefix : {"gc=", "generalcategory="}) {
    if (key.starts_with(prefix)) key = key.substr(std::string_view(prefix).size());
  }
  for (const CategoryName& n : kNames) {
    if (key == loose(n.short_name) || key == loose(n.long_name) || (*n.alias && key == loose(n.alias))) {
      return ranges_of(n.short_name);
    }
  }
  return std::nullopt;
}

}  // namespace cpf::models::data
