#pragma once
// Strict loading of config YAML: yaml-cpp accepts text whose meaning is not what the author wrote, and
// a config read that way trains something else without a word. load_strict_yaml refuses, with
// "file:line:column: problem", each of:
//   - control characters in the text (YAML allows tab, newline and carriage return only);
//   - an empty document (no keys: the defaults would train silently; `{}` says so explicitly);
//   - a second document after `---` (yaml-cpp's Load reads the first and drops the rest);
//   - a key twice in one mapping (yaml-cpp keeps both, readers see the first);
//   - a quote that is never closed (yaml-cpp ends the scalar at the end of the file, folding the
//     newline into a trailing space: `name: "abc` becomes "abc ").
// Private to cpf_config: it includes yaml-cpp, which the public headers do not.
#include <yaml-cpp/yaml.h>

#include <string>

namespace cpf::config {

// The one document of `text` (a mapping or anything else; the caller checks the root's type).
// `name` prefixes every message. Throws ConfigError.
YAML::Node load_strict_yaml(const std::string& text, const std::string& name);

// Refuses a key that appears twice in one mapping anywhere under `node`; `where` is the message
// prefix of the node ("file" or "--set a.b=c"), `path` the key path of `node` ("" at the root).
void check_unique_keys(const YAML::Node& node, const std::string& where, const std::string& path);

// "010", "-007", "00.5": YAML 1.1 and yaml-cpp read a leading zero as octal for integers (010 = 8),
// so such a number is refused rather than guessed. Returns the problem text, or "" when `text` is fine.
std::string leading_zero_problem(const std::string& text);

}  // namespace cpf::config
