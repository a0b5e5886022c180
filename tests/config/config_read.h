#pragma once
// Reads a describe()d options struct from YAML text the way the trainer reads a config file (load,
// --set overrides, every field, finish), for tests of the schema machinery on small demo structs.
#include <optional>
#include <string>
#include <vector>

#include "framework/config/schema.h"

namespace cpf::config::testing {

// `file` is the name the messages cite (file:line).
template <class Options>
Options read_options(const std::string& yaml, const std::string& file, const std::vector<std::string>& overrides) {
  auto doc = load_config_string(yaml, file);
  for (const auto& o : overrides) apply_override(*doc, o);
  Options options;
  ConfigReader reader(doc);
  describe(reader, options);
  reader.finish();
  return options;
}

// The ConfigError message read_options throws, or nullopt when the text is accepted.
template <class Options>
std::optional<std::string> config_error(const std::string& yaml, const std::string& file,
                                        const std::vector<std::string>& overrides) {
  try {
    read_options<Options>(yaml, file, overrides);
  } catch (const ConfigError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

}  // namespace cpf::config::testing
