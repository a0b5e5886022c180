#include "apps/cli/command_table.h"

#include <algorithm>
#include <sstream>

#include "framework/config/did_you_mean.h"
#include "models/data/bpe_pretokenizer.h"

#ifndef CPF_VERSION
#define CPF_VERSION "unknown"
#endif

namespace cpf::trainer {

const std::vector<CommandSpec>& all_commands() {
  // One line per command; the order is the order of `cpformer --help`.
  static const std::vector<CommandSpec> table = {
      train_command(),  generate_command(), check_config_command(),    plot_command(),
      export_command(), tokenize_command(), train_tokenizer_command(), docs_command(),
  };
  return table;
}

const CommandSpec* find_command(const std::string& name) {
  for (const auto& spec : all_commands()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

bool CommandLine::has(const std::string& name) const {
  return std::any_of(options.begin(), options.end(), [&](const auto& o) { return o.first == name; });
}

std::optional<std::string> CommandLine::value(const std::string& name) const {
  std::optional<std::string> last;
  for (const auto& [n, v] : options) {
    if (n == name) last = v;
  }
  return last;
}

std::vector<std::string> CommandLine::values(const std::string& name) const {
  std::vector<std::string> all;
  for (const auto& [n, v] : options) {
    if (n == name) all.push_back(v);
  }
  return all;
}

namespace {

constexpr size_t kHelpColumn = 30;  // where option and command descriptions start

// `left` padded to the help column (or on its own line when longer), then `text`.
std::string help_row(const std::string& left, const std::string& text) {
  std::string row = "  " + left;
  if (row.size() + 2 > kHelpColumn) {
    row += "\n" + std::string(kHelpColumn, ' ');
  } else {
    row.resize(kHelpColumn, ' ');
  }
  return row + text + "\n";
}

std::string option_left(const OptionSpec& o) {
  std::string left = o.name + (o.value_name.empty() ? "" : " " + o.value_name);
  return o.repeatable ? left + " ..." : left;
}

const OptionSpec* find_option(const CommandSpec& spec, const std::string& name) {
  for (const auto& o : spec.options) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

// An option this command does not take: a typo of one it does, or another command's option.
[[noreturn]] void reject_option(const CommandSpec& spec, const std::string& name) {
  std::vector<std::string> owners;
  for (const auto& other : all_commands()) {
    if (find_option(other, name)) owners.push_back("'" + other.name + "'");
  }
  if (!owners.empty()) {
    std::string list;
    for (size_t i = 0; i < owners.size(); ++i) list += (i == 0 ? "" : ", ") + owners[i];
    throw UsageError("'" + spec.name + "' takes no " + name + " (an option of " + list + ")", spec.name);
  }
  std::vector<std::string> names{"--help"};
  for (const auto& o : spec.options) names.push_back(o.name);
  throw UsageError("unknown option '" + name + "'" + config::did_you_mean_suffix(name, names), spec.name);
}

}  // namespace

CommandLine parse_command_line(const CommandSpec& spec, const std::vector<std::string>& args) {
  CommandLine line;
  line.command = spec.name;
  bool options_ended = false;  // after "--" every argument is positional (a file named "-x")
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!options_ended && arg == "--") {
      options_ended = true;
      continue;
    }
    if (options_ended || arg.size() < 2 || arg[0] != '-') {
      line.positional.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const OptionSpec* option = find_option(spec, name);
    if (!option) reject_option(spec, name);
    std::string value;
    if (option->value_name.empty()) {
      if (eq != std::string::npos) throw UsageError(name + " takes no value (got '" + arg + "')", spec.name);
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) throw UsageError(name + " needs a value", spec.name);
      value = args[++i];
    }
    if (!option->repeatable && line.has(name)) {
      throw UsageError(name + " is given twice ('" + *line.value(name) + "' and '" + value + "'); give it once",
                       spec.name);
    }
    line.options.emplace_back(name, value);
  }
  return line;
}

std::string usage() {
  std::string text =
      "usage: cpformer <command> [arguments] [options]\n"
      "       cpformer <command> --help      what a command does and its options\n"
      "       cpformer --version\n"
      "commands:\n";
  for (const auto& spec : all_commands()) text += help_row(spec.name + " " + spec.arguments, spec.summary);
  text +=
      "exit codes: 0 ok, 1 error, 2 config or usage error, 3 unreadable data, 4 training target not reached,\n"
      "            130 / 143 stopped by SIGINT / SIGTERM (after a checkpoint; run the same command to resume)\n"
      "docs: README.md, docs/training.md (running and monitoring), docs/config.md (every config key)\n";
  return text;
}

std::string command_usage(const CommandSpec& spec) {
  return "usage: cpformer " + spec.name + (spec.arguments.empty() ? "" : " " + spec.arguments) +
         (spec.options.empty() ? "" : " [options]") + "\n(all options: cpformer " + spec.name + " --help)\n";
}

std::string command_help(const CommandSpec& spec) {
  std::string text = "usage: cpformer " + spec.name + (spec.arguments.empty() ? "" : " " + spec.arguments) +
                     (spec.options.empty() ? "" : " [options]") + "\n\n" + spec.summary + "\n";
  if (!spec.description.empty()) text += "\n" + spec.description + (spec.description.back() == '\n' ? "" : "\n");
  text += "\noptions:\n";
  for (const auto& o : spec.options) text += help_row(option_left(o), o.help);
  text += help_row("-h, --help", "print this help and exit");
  return text;
}

std::string version_text() {
  std::string features;
#if CPF_HAVE_CUDA
  features += "cuda";
#else
  features += "cpu only";
#endif
#if CPF_HAVE_NCCL
  features += ", nccl";
#endif
#if defined(CPF_WITH_OPENMP)
  features += ", openmp";
#endif
  return std::string("cpformer ") + CPF_VERSION + " (" + features + ")\ntokenizer character classes: Unicode " +
         models::data::pretokenizer_unicode_version() + " (bundled table); White_Space and NFC: Unicode " +
         models::data::icu_unicode_version() + " (ICU)\n";
}

namespace {

template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  size_t used = 0;
  try {
    T v;
    if constexpr (std::is_same_v<T, double>) {
      v = std::stod(text, &used);
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      v = std::stoull(text, &used);
    } else {
      v = static_cast<T>(std::stoll(text, &used));
    }
    if (used == text.size() && !text.empty()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + " " + text + ": expected a number");
}

}  // namespace

int64_t parse_integer_option(const std::string& flag, const std::string& text) {
  return parse_number<int64_t>(flag, text);
}
uint64_t parse_unsigned_option(const std::string& flag, const std::string& text) {
  return parse_number<uint64_t>(flag, text);
}
double parse_real_option(const std::string& flag, const std::string& text) { return parse_number<double>(flag, text); }

}  // namespace cpf::trainer
