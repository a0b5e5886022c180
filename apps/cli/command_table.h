#pragma once
// The table of `cpformer` commands: each command's name, arguments, one-line summary, description and
// options, and the function that runs it. `cpformer --help`, `cpformer COMMAND --help`, the option
// parser and the "did you mean" suggestions all read this one table, so a command is documented the
// moment it is added.
//
// Adding a command: write `CommandSpec your_command()` next to the command's code (its own file) and
// add one line to all_commands() in command_table.cpp. Options are declared, not parsed by hand:
// parse_command_line() checks them (unknown options, missing values, options of other commands) and
// hands the handler a CommandLine. The handler validates values and positional arguments and throws
// UsageError (exit 2, with the command's usage) for a bad command line.
#include <cstdint>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace cpf::trainer {

// A bad command line: exit code 2, the message, then the usage of `command` (or of cpformer).
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message, std::string command = "")
      : std::runtime_error(message), command_(std::move(command)) {}
  const std::string& command() const { return command_; }

 private:
  std::string command_;
};

struct OptionSpec {
  std::string name;         // "--tokens"
  std::string value_name;   // "N"; empty for a flag that takes no value
  std::string help;         // one line (wrapped by the help printer)
  bool repeatable = false;  // may be given several times (--set)
};

// What parse_command_line() hands a command: positional arguments and option values in order.
struct CommandLine {
  std::string command;
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> options;  // (name, value), flags with ""

  bool has(const std::string& name) const;
  std::optional<std::string> value(const std::string& name) const;  // the last one given
  std::vector<std::string> values(const std::string& name) const;   // every one, in order
};

// `out`: the command's output; `err`: diagnostics (stderr); `terminal`: stdout is a terminal.
using CommandHandler = int (*)(const CommandLine& line, std::ostream& out, std::ostream& err, bool terminal);

struct CommandSpec {
  std::string name;                 // "train"
  std::string arguments;            // positional arguments for the synopsis: "CONFIG", "RUN [RUN ...]"
  std::string summary;              // one line for `cpformer --help`
  std::string description;          // paragraphs for `cpformer NAME --help` (lines already wrapped)
  std::vector<OptionSpec> options;  // --help is implied
  CommandHandler run = nullptr;
};

// Every command, in the order `cpformer --help` lists them.
const std::vector<CommandSpec>& all_commands();
const CommandSpec* find_command(const std::string& name);

// `cpformer --help`: every command with its summary, the exit codes, where to read more.
std::string usage();
// `cpformer NAME --help`: synopsis, description, every option.
std::string command_help(const CommandSpec& spec);
// "usage: cpformer NAME ARGS [options]" and a pointer to `cpformer NAME --help`.
std::string command_usage(const CommandSpec& spec);
// "cpformer 0.1.0 (...build features...)".
std::string version_text();

// Parses the arguments after the command name. Throws UsageError for an unknown option (naming the
// nearest option of this command), an option of another command, a missing value, a value given to a
// flag or a repeated single-use option. --help/-h are recognised by the caller before this runs. After
// "--" every argument is positional.
CommandLine parse_command_line(const CommandSpec& spec, const std::vector<std::string>& args);

// A whole-string integer or floating-point number of an option, or UsageError "FLAG TEXT: expected a number".
int64_t parse_integer_option(const std::string& flag, const std::string& text);
uint64_t parse_unsigned_option(const std::string& flag, const std::string& text);
double parse_real_option(const std::string& flag, const std::string& text);

// The command specs, each defined next to its command's code.
CommandSpec train_command();            // train_command.cpp
CommandSpec check_config_command();     // train_command.cpp
CommandSpec docs_command();             // train_command.cpp
CommandSpec generate_command();         // generate_command.cpp
CommandSpec plot_command();             // plot_command.cpp
CommandSpec export_command();           // export_command.cpp
CommandSpec tokenize_command();         // tokenize_command.cpp
CommandSpec train_tokenizer_command();  // tokenize_command.cpp

}  // namespace cpf::trainer
