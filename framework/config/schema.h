#pragma once
// Config is data: every component has an options struct whose fields are its YAML keys, and one
// `describe(visitor, options)` function that names each field once. Three visitors walk the same
// description: ConfigReader (YAML -> struct, with file:line:column errors), ConfigWriter (struct ->
// YAML, the effective config written to the run folder) and ConfigDocs (key, type, default, meaning
// for docs/config.md). A field therefore cannot be parsed without being documented and written back.
//
//   template <class V> void describe(V& v, OptimizerOptions& o) {
//     v.field("lr", o.lr, "peak learning rate", config::Range{0.0, 10.0});
//     v.choice("type", o.type, {{"adamw", OptimizerType::adamw}, {"sgd", OptimizerType::sgd}}, "update rule");
//   }
//
// yaml-cpp stays inside the .cpp files: this header compiles without it.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/error.h"

namespace cpf::config {

// Raised for any problem in a config; what() is "file:line:column: key.path=value: problem" (the
// message names its own location, so no source location is appended). A cpf::Error like every other
// error; the CLI catches it first and turns it into exit code 2.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error("", 0, "", message) {}
  const char* what() const noexcept override { return message().c_str(); }
};

struct Range {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
};

template <class E>
using Choices = std::vector<std::pair<std::string, E>>;

// Where a key came from: a file position, or a --set override.
struct Location {
  std::string file;
  int line = 0;               // 1-based; 0 when unknown
  int column = 0;             // 1-based
  std::string override_text;  // "--set a.b=c" when set on the command line
  std::string str() const;
};

class ConfigDocument;  // parsed YAML tree + locations (opaque)

// Loads YAML text (file or string); --set overrides rewrite the tree before reading.
std::shared_ptr<ConfigDocument> load_config_file(const std::string& path);
std::shared_ptr<ConfigDocument> load_config_string(const std::string& yaml, const std::string& name = "<string>");
// "a.b.c=value": value is parsed as a YAML scalar or flow collection. Unknown paths are created (and
// then reported as unknown keys by the reader, with the --set text as location).
void apply_override(ConfigDocument& doc, const std::string& assignment);

class ConfigReader {
 public:
  explicit ConfigReader(std::shared_ptr<ConfigDocument> doc);
  ~ConfigReader();

  void field(const std::string& key, int64_t& value, const std::string& help, Range range = {});
  void field(const std::string& key, int& value, const std::string& help, Range range = {});
  void field(const std::string& key, double& value, const std::string& help, Range range = {});
  void field(const std::string& key, bool& value, const std::string& help);
  void field(const std::string& key, std::string& value, const std::string& help);
  template <class E>
  void choice(const std::string& key, E& value, const Choices<E>& choices, const std::string& help) {
    std::string name = name_of(value, choices);
    std::vector<std::string> names;
    for (const auto& c : choices) names.push_back(c.first);
    read_choice(key, name, names);
    for (const auto& c : choices) {
      if (c.first == name) value = c.second;
    }
  }
  template <class S>
  void section(const std::string& key, S& options, const std::string& help) {
    if (!enter(key)) return;
    describe(*this, options);
    leave();
  }

  // After reading: every key present in the YAML must have been read.
  void finish();
  // Location of a key path ("model.num_heads") for cross-field checks, and the error for it.
  Location location(const std::string& path) const;
  [[noreturn]] void fail(const std::string& path, const std::string& message) const;

 private:
  template <class E>
  static std::string name_of(const E& value, const Choices<E>& choices) {
    for (const auto& c : choices) {
      if (c.second == value) return c.first;
    }
    return choices.empty() ? std::string() : choices.front().first;
  }
  void read_choice(const std::string& key, std::string& name, const std::vector<std::string>& names);
  bool enter(const std::string& key);
  void leave();
  struct State;
  std::unique_ptr<State> state_;
};

// Emits the struct as YAML (block style, keys in description order, help as comments).
class ConfigWriter {
 public:
  ConfigWriter();
  ~ConfigWriter();
  void field(const std::string& key, int64_t value, const std::string& help, Range = {});
  void field(const std::string& key, int value, const std::string& help, Range = {});
  void field(const std::string& key, double value, const std::string& help, Range = {});
  void field(const std::string& key, bool value, const std::string& help);
  void field(const std::string& key, const std::string& value, const std::string& help);
  template <class E>
  void choice(const std::string& key, const E& value, const Choices<E>& choices, const std::string& help) {
    for (const auto& c : choices) {
      if (c.second == value) field(key, c.first, help);
    }
  }
  template <class S>
  void section(const std::string& key, S& options, const std::string& help) {
    begin_section(key, help);
    describe(*this, options);
    end_section();
  }
  std::string str() const;

 private:
  void begin_section(const std::string& key, const std::string& help);
  void end_section();
  struct State;
  std::unique_ptr<State> state_;
};

// Collects (key path, type, default, meaning) rows in description order.
class ConfigDocs {
 public:
  struct Row {
    std::string key;
    std::string type;
    std::string default_value;
    std::string help;
  };
  void field(const std::string& key, int64_t value, const std::string& help, Range range = {});
  void field(const std::string& key, int value, const std::string& help, Range range = {});
  void field(const std::string& key, double value, const std::string& help, Range range = {});
  void field(const std::string& key, bool value, const std::string& help);
  void field(const std::string& key, const std::string& value, const std::string& help);
  template <class E>
  void choice(const std::string& key, const E& value, const Choices<E>& choices, const std::string& help) {
    std::string names, current;
    for (const auto& c : choices) {
      names += (names.empty() ? "one of " : ", ") + c.first;
      if (c.second == value) current = c.first;
    }
    add(key, names, current, help);
  }
  template <class S>
  void section(const std::string& key, S& options, const std::string& help) {
    prefix_.push_back(key);
    describe(*this, options);
    prefix_.pop_back();
  }
  const std::vector<Row>& rows() const { return rows_; }
  // A Markdown table of the rows.
  std::string markdown() const;

 private:
  void add(const std::string& key, const std::string& type, const std::string& default_value, const std::string& help);
  std::vector<std::string> prefix_;
  std::vector<Row> rows_;
};

}  // namespace cpf::config
