#include "framework/config/schema.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "framework/config/did_you_mean.h"
#include "framework/config/yaml_strict.h"

namespace cpf::config {

struct ConfigDocument {
  YAML::Node root;
  std::string file;
  std::map<std::string, std::string> overrides;  // key path -> "--set ..." text
};

namespace {

std::string join_path(const std::vector<std::string>& parts, const std::string& key) {
  std::string out;
  for (const auto& p : parts) out += p + ".";
  return out + key;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  return parts;
}

std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

std::string format_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

std::string Location::str() const {
  if (!override_text.empty()) return override_text;
  std::string out = file;
  if (line > 0) out += ":" + std::to_string(line) + ":" + std::to_string(column);
  return out;
}

std::shared_ptr<ConfigDocument> load_config_string(const std::string& yaml, const std::string& name) {
  auto doc = std::make_shared<ConfigDocument>();
  doc->file = name;
  doc->root = load_strict_yaml(yaml, name);
  if (!doc->root.IsMap()) throw ConfigError(name + ":1:1: the config must be a mapping of sections");
  return doc;
}

// Larger than any config: a file this big is the wrong one (a data file named by mistake).
constexpr uintmax_t kMaxConfigBytes = uintmax_t{16} << 20;

std::shared_ptr<ConfigDocument> load_config_file(const std::string& path) {
  // A directory opens as an empty stream on Linux: it would read as an empty config.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(path + ": is a directory, not a config file; name the YAML file in it");
  }
  // A device, pipe or socket (/dev/zero) would be read until memory runs out: a config is a regular file.
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw ConfigError(path + ": is not a regular file (a device, pipe or socket); name a YAML file");
  }
  if (std::filesystem::exists(status)) {
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size > kMaxConfigBytes) {
      throw ConfigError(path + ": is " + std::to_string(size) + " bytes; a config is a few KB (the limit is " +
                        std::to_string(kMaxConfigBytes) + " bytes): is this the right file?");
    }
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open the config file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw ConfigError(path + ": reading the config file failed");
  return load_config_string(buffer.str(), path);
}

namespace {

// Sets every key of `value` in the section `section` (path `path`), merging nested sections the same way.
void merge_mapping(YAML::Node section, const YAML::Node& value, const std::string& path, const std::string& text,
                   std::map<std::string, std::string>& overrides) {
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string key = it->first.as<std::string>();
    YAML::Node existing = section[key];
    if (existing.IsDefined() && existing.IsMap() && it->second.IsMap()) {
      merge_mapping(existing, it->second, path + "." + key, text, overrides);
      continue;
    }
    section[key] = it->second;
    overrides[path + "." + key] = text;
  }
}

}  // namespace

void apply_override(ConfigDocument& doc, const std::string& assignment) {
  const auto eq = assignment.find('=');
  const std::string text = "--set " + assignment;
  if (eq == std::string::npos || eq == 0) throw ConfigError(text + ": expected key.path=value");
  const std::string path = assignment.substr(0, eq);
  const auto parts = split_path(path);
  for (const auto& part : parts) {
    if (part.empty() || part.find_first_of(" \t") != std::string::npos || path.back() == '.') {
      throw ConfigError(text + ": '" + path + "' is not a key path (expected section.key, no empty parts)");
    }
  }
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError(text + ": invalid value: " + e.msg);
  }
  check_unique_keys(value, text, path);
  // Walk down with a vector of nodes (yaml-cpp nodes are handles; reassignment would rebind). Sections
  // the override creates are its own: an error about them names the --set, not the file.
  std::vector<YAML::Node> chain{doc.root};
  std::string prefix;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix += (i ? "." : "") + parts[i];
    YAML::Node child = chain.back()[parts[i]];
    if (!child.IsDefined() || child.IsNull()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      child = chain.back()[parts[i]];
      doc.overrides.emplace(prefix, text);
    }
    if (!child.IsMap()) throw ConfigError(text + ": '" + parts[i] + "' is not a section");
    chain.push_back(child);
  }
  YAML::Node current = chain.back()[parts.back()];
  if (current.IsDefined() && current.IsMap() && !value.IsMap()) {
    throw ConfigError(text + ": '" + path + "' is a section; set its keys one by one (--set " + path + ".KEY=VALUE)");
  }
  if (current.IsDefined() && current.IsMap()) {
    // A mapping over a section sets the keys it names and keeps the file's others (run={steps: 5} keeps
    // run.name): replacing the section would drop them without a word.
    merge_mapping(current, value, path, text, doc.overrides);
    return;
  }
  chain.back()[parts.back()] = value;
  doc.overrides[path] = text;
}

// ---- reader ---------------------------------------------------------------------------------

struct ConfigReader::State {
  std::shared_ptr<ConfigDocument> doc;
  std::vector<YAML::Node> nodes;                       // current mapping stack
  std::vector<std::string> prefix;                     // key path of the stack
  std::set<std::string> consumed;                      // key paths read (leaves and sections)
  std::map<std::string, std::set<std::string>> known;  // section path -> keys it accepts
  std::map<std::string, Location> locations;

  // The leaf `key` of the current section: registers it as accepted and, when present, as read with
  // its location. Returns the value node (undefined when absent); `path` is the key's full path.
  YAML::Node take(const std::string& key, std::string& path);

  Location locate(const std::string& path, const YAML::Mark& mark) const {
    Location loc;
    loc.file = doc->file;
    // The key, or a section above it, set by a --set: positions inside a --set value are not the file's.
    for (std::string p = path;;) {
      auto it = doc->overrides.find(p);
      if (it != doc->overrides.end()) {
        loc.override_text = it->second;
        return loc;
      }
      const size_t dot = p.rfind('.');
      if (dot == std::string::npos) break;
      p.resize(dot);
    }
    if (mark.line >= 0) {
      loc.line = mark.line + 1;
      loc.column = mark.column + 1;
    }
    return loc;
  }
};

ConfigReader::ConfigReader(std::shared_ptr<ConfigDocument> doc) : state_(std::make_unique<State>()) {
  state_->doc = std::move(doc);
  state_->nodes.push_back(state_->doc->root);
}

ConfigReader::~ConfigReader() = default;

namespace {

// The value node for `key` in the current mapping, or an undefined node. `mark` is where the value is,
// or the key when the value is empty (yaml-cpp marks an empty value at the next line).
YAML::Node lookup(const YAML::Node& map, const std::string& key, YAML::Mark& mark) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (it->first.Scalar() == key) {
      mark = it->second.IsNull() ? it->first.Mark() : it->second.Mark();
      return it->second;
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

// "run.steps: no value": an empty value is a mistake, not a request for the default.
std::string no_value(const std::string& path) {
  return path + " has no value; write one, or remove the key to keep the default";
}

}  // namespace

YAML::Node ConfigReader::State::take(const std::string& key, std::string& path) {
  path = join_path(prefix, key);
  known[join_path(prefix, "")].insert(key);
  YAML::Mark mark;
  YAML::Node node = lookup(nodes.back(), key, mark);
  if (!node.IsDefined()) return node;
  consumed.insert(path);
  locations[path] = locate(path, mark);
  return node;
}

Location ConfigReader::location(const std::string& path) const {
  auto it = state_->locations.find(path);
  if (it != state_->locations.end()) return it->second;
  Location loc;
  loc.file = state_->doc->file;
  return loc;
}

void ConfigReader::fail(const std::string& path, const std::string& message) const {
  throw ConfigError(location(path).str() + ": " + message);
}

#define CPF_CONFIG_READ_SCALAR(TYPE, CONVERT, EXPECTED)                                            \
  void ConfigReader::field(const std::string& key, TYPE& value, const std::string&, Range range) { \
    std::string path;                                                                              \
    const YAML::Node node = state_->take(key, path);                                               \
    if (!node.IsDefined()) return;                                                                 \
    if (node.IsNull()) fail(path, no_value(path));                                                 \
    const std::string text = scalar_text(node);                                                    \
    TYPE parsed{};                                                                                 \
    const std::string zero = leading_zero_problem(text);                                           \
    if (!zero.empty()) fail(path, path + "=" + text + ": " + zero);                                \
    try {                                                                                          \
      if (!node.IsScalar()) throw YAML::Exception(YAML::Mark::null_mark(), "");                    \
      parsed = CONVERT;                                                                            \
    } catch (const YAML::Exception&) {                                                             \
      fail(path, path + "=" + text + ": expected " EXPECTED);                                      \
    }                                                                                              \
    const double as_double = static_cast<double>(parsed);                                          \
    if (!(as_double >= range.min && as_double <= range.max)) {                                     \
      fail(path, path + "=" + text + " is out of range [" + format_double(range.min) + ", " +      \
                     format_double(range.max) + "]");                                              \
    }                                                                                              \
    value = parsed;                                                                                \
  }

CPF_CONFIG_READ_SCALAR(int64_t, node.as<int64_t>(), "an integer")
CPF_CONFIG_READ_SCALAR(int, node.as<int>(), "an integer")
CPF_CONFIG_READ_SCALAR(double, node.as<double>(), "a number")
#undef CPF_CONFIG_READ_SCALAR

void ConfigReader::field(const std::string& key, bool& value, const std::string&) {
  std::string path;
  const YAML::Node node = state_->take(key, path);
  if (!node.IsDefined()) return;
  if (node.IsNull()) fail(path, no_value(path));
  try {
    if (!node.IsScalar()) throw YAML::Exception(YAML::Mark::null_mark(), "");
    value = node.as<bool>();
  } catch (const YAML::Exception&) {
    fail(path, path + "=" + scalar_text(node) + ": expected true or false");
  }
}

void ConfigReader::field(const std::string& key, std::string& value, const std::string&) {
  std::string path;
  const YAML::Node node = state_->take(key, path);
  if (!node.IsDefined()) return;
  if (node.IsNull()) fail(path, no_value(path));
  if (!node.IsScalar()) fail(path, path + "=" + scalar_text(node) + ": expected a string");
  value = node.Scalar();
}

void ConfigReader::read_choice(const std::string& key, std::string& name, const std::vector<std::string>& names) {
  std::string text = name;
  field(key, text, "");
  const std::string path = join_path(state_->prefix, key);
  for (const auto& n : names) {
    if (n == text) {
      name = text;
      return;
    }
  }
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  fail(path, path + "=" + text + " is not one of: " + list);
}

bool ConfigReader::enter(const std::string& key) {
  const std::string path = join_path(state_->prefix, key);
  state_->known[join_path(state_->prefix, "")].insert(key);
  YAML::Mark mark;
  YAML::Node node = lookup(state_->nodes.back(), key, mark);
  if (!node.IsDefined() || node.IsNull()) {
    state_->consumed.insert(path);
    return false;
  }
  state_->consumed.insert(path);
  state_->locations[path] = state_->locate(path, mark);
  if (!node.IsMap()) fail(path, path + ": expected a section (a mapping of keys), got " + scalar_text(node));
  state_->nodes.push_back(node);
  state_->prefix.push_back(key);
  return true;
}

void ConfigReader::leave() {
  state_->nodes.pop_back();
  state_->prefix.pop_back();
}

void ConfigReader::finish() {
  // Depth-first over the document: the first key nobody read is an error.
  struct Item {
    YAML::Node node;
    std::string prefix;
  };
  std::vector<Item> stack{{state_->doc->root, ""}};
  while (!stack.empty()) {
    Item item = stack.back();
    stack.pop_back();
    for (auto it = item.node.begin(); it != item.node.end(); ++it) {
      const std::string key = it->first.Scalar();
      const std::string path = item.prefix.empty() ? key : item.prefix + "." + key;
      if (!state_->consumed.count(path)) {
        std::string valid;
        const auto& here = state_->known[item.prefix.empty() ? "" : item.prefix + "."];
        for (const auto& k : here) valid += (valid.empty() ? "" : ", ") + k;
        // A typo of a key of this section: name the key it probably meant, in full.
        const auto guess = closest_match(key, std::vector<std::string>(here.begin(), here.end()));
        const std::string hint =
            guess ? "; did you mean '" + (item.prefix.empty() ? "" : item.prefix + ".") + *guess + "'?" : "";
        throw ConfigError(state_->locate(path, it->first.Mark()).str() + ": unknown key '" + path + "'" +
                          (valid.empty() ? "" : " (valid keys here: " + valid + ")") + hint);
      }
      if (it->second.IsMap()) stack.push_back({it->second, path});
    }
  }
}

// ---- writer ---------------------------------------------------------------------------------

struct ConfigWriter::State {
  YAML::Emitter out;
};

ConfigWriter::ConfigWriter() : state_(std::make_unique<State>()) { state_->out << YAML::BeginMap; }
ConfigWriter::~ConfigWriter() = default;

void ConfigWriter::field(const std::string& key, int64_t value, const std::string&, Range) {
  state_->out << YAML::Key << key << YAML::Value << value;
}
void ConfigWriter::field(const std::string& key, int value, const std::string&, Range) {
  state_->out << YAML::Key << key << YAML::Value << value;
}
void ConfigWriter::field(const std::string& key, double value, const std::string&, Range) {
  state_->out << YAML::Key << key << YAML::Value << format_double(value);
}
void ConfigWriter::field(const std::string& key, bool value, const std::string&) {
  state_->out << YAML::Key << key << YAML::Value << value;
}
void ConfigWriter::field(const std::string& key, const std::string& value, const std::string&) {
  state_->out << YAML::Key << key << YAML::Value << value;
}
void ConfigWriter::begin_section(const std::string& key, const std::string&) {
  state_->out << YAML::Key << key << YAML::Value << YAML::BeginMap;
}
void ConfigWriter::end_section() { state_->out << YAML::EndMap; }

std::string ConfigWriter::str() const {
  std::string text = state_->out.c_str();
  return text + "\n";
}

// ---- docs -----------------------------------------------------------------------------------

void ConfigDocs::add(const std::string& key, const std::string& type, const std::string& default_value,
                     const std::string& help) {
  rows_.push_back({join_path(prefix_, key), type, default_value, help});
}

namespace {
std::string range_suffix(Range r) {
  if (std::isinf(r.min) && std::isinf(r.max)) return "";
  return " in [" + (std::isinf(r.min) ? std::string("-inf") : format_double(r.min)) + ", " +
         (std::isinf(r.max) ? std::string("inf") : format_double(r.max)) + "]";
}
}  // namespace

void ConfigDocs::field(const std::string& key, int64_t value, const std::string& help, Range range) {
  add(key, "int" + range_suffix(range), std::to_string(value), help);
}
void ConfigDocs::field(const std::string& key, int value, const std::string& help, Range range) {
  add(key, "int" + range_suffix(range), std::to_string(value), help);
}
void ConfigDocs::field(const std::string& key, double value, const std::string& help, Range range) {
  add(key, "float" + range_suffix(range), format_double(value), help);
}
void ConfigDocs::field(const std::string& key, bool value, const std::string& help) {
  add(key, "bool", value ? "true" : "false", help);
}
void ConfigDocs::field(const std::string& key, const std::string& value, const std::string& help) {
  add(key, "string", value.empty() ? "\"\"" : value, help);
}

std::string ConfigDocs::markdown() const {
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& r : rows_) {
    out += "| `" + r.key + "` | " + r.type + " | `" + r.default_value + "` | " + r.help + " |\n";
  }
  return out;
}

}  // namespace cpf::config
