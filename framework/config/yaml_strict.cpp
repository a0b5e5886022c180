#include "framework/config/yaml_strict.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "framework/config/schema.h"

namespace cpf::config {
namespace {

std::string at(const std::string& name, int line, int column) {
  return name + ":" + std::to_string(line) + ":" + std::to_string(column);
}

// Only tab, newline and carriage return are allowed below 0x20 (and DEL is refused too): a stray
// NUL or backspace is invisible in an editor and ends up in names and paths.
void check_control_characters(const std::string& text, const std::string& name) {
  int line = 1, column = 1;
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if ((byte < 0x20 && byte != '\t' && byte != '\n' && byte != '\r') || byte == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", byte);
      throw ConfigError(at(name, line, column) + ": control character " + hex +
                        " in the file (YAML allows tab, newline and carriage return only); remove it");
    }
    if (byte == '\n') {
      ++line;
      column = 1;
    } else if ((byte & 0xc0) != 0x80) {  // count characters, not UTF-8 continuation bytes
      ++column;
    }
  }
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return lines;
}

bool is_marker(const std::string& line, const char* marker) {
  return line.rfind(marker, 0) == 0 && (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
}

// 1-based line of the marker (`---` or `...` in column 1) that ends the first document: the first
// one after content. 0 when none is found (the caller then uses the second document's position).
int second_document_line(const std::string& text) {
  const auto lines = split_lines(text);
  bool content = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const bool marker = is_marker(l, "---") || is_marker(l, "...");
    if (marker && content) return static_cast<int>(i) + 1;
    const size_t first = l.find_first_not_of(" \t\r");
    const std::string rest = marker ? l.substr(3) : l;
    const size_t rest_first = rest.find_first_not_of(" \t\r");
    if (first != std::string::npos && l[first] != '#' && l[first] != '%' && rest_first != std::string::npos &&
        rest[rest_first] != '#') {
      content = true;
    }
  }
  return 0;
}

// Byte offset of a yaml-cpp mark (0-based line, column in characters), or npos.
size_t offset_of(const std::string& text, const YAML::Mark& mark) {
  if (mark.line < 0 || mark.column < 0) return std::string::npos;
  size_t pos = 0;
  for (int l = 0; l < mark.line; ++l) {
    pos = text.find('\n', pos);
    if (pos == std::string::npos) return pos;
    ++pos;
  }
  for (int c = 0; c < mark.column && pos < text.size(); ++c) {
    ++pos;
    while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xc0) == 0x80) ++pos;
  }
  return pos < text.size() ? pos : std::string::npos;
}

// True when the quoted scalar opening at `open` has its closing quote in `text`.
bool quote_closes(const std::string& text, size_t open) {
  const char quote = text[open];
  for (size_t i = open + 1; i < text.size(); ++i) {
    if (quote == '"' && text[i] == '\\') {
      ++i;  // an escape: the next character is never the closing quote
    } else if (text[i] == quote) {
      if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        ++i;  // '' is an escaped single quote
      } else {
        return true;
      }
    }
  }
  return false;
}

void check_quotes(const YAML::Node& node, const std::string& text, const std::string& name) {
  if (node.IsScalar()) {
    if (node.Tag() != "!") return;  // "!" is the tag yaml-cpp gives quoted scalars
    const size_t open = offset_of(text, node.Mark());
    if (open == std::string::npos || (text[open] != '"' && text[open] != '\'')) return;
    if (!quote_closes(text, open)) {
      throw ConfigError(at(name, node.Mark().line + 1, node.Mark().column + 1) + ": the quote " + text[open] +
                        " opened here is never closed (YAML would read to the end of the file: \"" + node.Scalar() +
                        "\"); close it on this line");
    }
    return;
  }
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      check_quotes(it->first, text, name);
      check_quotes(it->second, text, name);
    }
  } else if (node.IsSequence()) {
    for (auto it = node.begin(); it != node.end(); ++it) check_quotes(*it, text, name);
  }
}

}  // namespace

void check_unique_keys(const YAML::Node& node, const std::string& where, const std::string& path) {
  const bool in_file = where.rfind("--set ", 0) != 0;  // positions inside a --set value mean nothing to its author
  auto locate = [&](const YAML::Node& n) {
    return in_file && n.Mark().line >= 0 ? at(where, n.Mark().line + 1, n.Mark().column + 1) : where;
  };
  if (node.IsMap()) {
    std::map<std::string, YAML::Node> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      const std::string key_path = path.empty() ? key : path + "." + key;
      auto [first, inserted] = seen.emplace(key, it->first);
      if (!inserted) {
        const int first_line = in_file ? first->second.Mark().line + 1 : 0;
        throw ConfigError(locate(it->first) + ": duplicate key '" + key_path + "'" +
                          (first_line > 0 ? " (first at line " + std::to_string(first_line) + ")" : "") +
                          "; YAML keeps one of them silently, so keep only the one you mean");
      }
      check_unique_keys(it->second, where, key_path);
    }
  } else if (node.IsSequence()) {
    size_t i = 0;
    for (auto it = node.begin(); it != node.end(); ++it, ++i) {
      check_unique_keys(*it, where, path + "[" + std::to_string(i) + "]");
    }
  }
}

std::string leading_zero_problem(const std::string& text) {
  const size_t digits = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  if (text.size() < digits + 2 || text[digits] != '0' || text[digits + 1] < '0' || text[digits + 1] > '9') return "";
  const size_t nonzero = text.find_first_not_of('0', digits);
  std::string decimal = text.substr(0, digits) + (nonzero == std::string::npos || text[nonzero] == '.' ? "0" : "") +
                        (nonzero == std::string::npos ? "" : text.substr(nonzero));
  return "a leading zero makes YAML read an integer as octal (010 is 8); write " + decimal + " without the zero";
}

namespace {

// Flow collections ([ ] and { }) nested deeper than a config ever needs: the YAML parser would recurse
// until it gives up with "bad file" and no position, so the depth is checked here first, naming where.
void check_nesting_depth(const std::string& text, const std::string& name) {
  constexpr int kMaxDepth = 64;
  int depth = 0, line = 1, column = 0;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    ++column;
    if (ch == '\n') {
      ++line;
      column = 0;
      quote = 0;  // plain configs never continue a quoted scalar over lines; a stray quote ends here
      continue;
    }
    if (quote != 0) {
      if (ch == quote) quote = 0;
      continue;
    }
    if (ch == '"' || ch == '\'') {
      quote = ch;
    } else if (ch == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t')) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;  // a comment: to the end of the line
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxDepth) {
        throw ConfigError(at(name, line, column) + ": brackets nested more than " + std::to_string(kMaxDepth) +
                          " levels deep; a config needs a few (the limit keeps the YAML parser from recursing "
                          "without bound)");
      }
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
}

}  // namespace

YAML::Node load_strict_yaml(const std::string& text, const std::string& name) {
  check_control_characters(text, name);
  check_nesting_depth(text, name);
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(at(name, e.mark.line + 1, e.mark.column + 1) + ": invalid YAML: " + e.msg);
  }
  if (docs.empty() || (docs.size() == 1 && docs[0].IsNull())) {
    throw ConfigError(name +
                      ":1: the config is empty (no keys), so every default would train without a word; "
                      "write the keys to set, or {} to train the defaults on purpose");
  }
  if (docs.size() > 1) {
    int line = second_document_line(text);
    if (line == 0) line = docs[1].Mark().line + 1;
    throw ConfigError(name + ":" + std::to_string(std::max(line, 1)) +
                      ": a second YAML document starts here; a config is one document (YAML readers drop or "
                      "ignore the rest), so merge it into the first or remove it");
  }
  check_unique_keys(docs[0], name, "");
  check_quotes(docs[0], text, name);
  return docs[0];
}

}  // namespace cpf::config
