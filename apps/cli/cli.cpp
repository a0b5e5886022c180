#include "apps/cli/cli.h"

#include <new>

#include "apps/cli/command_table.h"
#include "apps/config/config.h"
#include "apps/trainer/trainer.h"
#include "framework/config/did_you_mean.h"

namespace cpf::trainer {

namespace {

bool is_help(const std::string& arg) { return arg == "--help" || arg == "-h"; }

// `cpformer`, `cpformer --help`, `cpformer help [COMMAND]`, `cpformer --version`: nullopt when `args`
// name a command to run instead.
std::optional<int> answer_meta_request(const std::vector<std::string>& args, std::ostream& out) {
  if (args.empty()) throw UsageError("no command given");
  const std::string& first = args[0];
  if (first == "--version" || first == "-V" || first == "version") {
    out << version_text();
    return kExitOk;
  }
  if (is_help(first) || (first == "help" && args.size() == 1)) {
    out << usage();
    return kExitOk;
  }
  if (first == "help") {
    const CommandSpec* spec = find_command(args[1]);
    if (!spec) return std::nullopt;  // reported as an unknown command below
    out << command_help(*spec);
    return kExitOk;
  }
  return std::nullopt;
}

const CommandSpec& command_named(const std::string& name) {
  if (const CommandSpec* spec = find_command(name)) return *spec;
  std::vector<std::string> names{"help", "version"};
  for (const auto& spec : all_commands()) names.push_back(spec.name);
  if (!name.empty() && name[0] == '-') {
    throw UsageError("'" + name + "' before a command: options follow the command (cpformer COMMAND " + name + ")" +
                     config::did_you_mean_suffix(name, {"--help", "--version"}));
  }
  throw UsageError("unknown command '" + name + "'" + config::did_you_mean_suffix(name, names));
}

int dispatch(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool terminal,
             std::string* command) {
  if (const auto answered = answer_meta_request(args, out)) return *answered;
  const bool help_of = args[0] == "help";
  const CommandSpec& spec = command_named(help_of ? args[1] : args[0]);
  *command = spec.name;
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  // --help anywhere before a "--" asks for help, whatever else is on the line.
  for (const auto& arg : rest) {
    if (arg == "--") break;
    if (is_help(arg)) {
      out << command_help(spec);
      return kExitOk;
    }
  }
  return spec.run(parse_command_line(spec, rest), out, err, terminal);
}

}  // namespace

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool terminal) {
  std::string command;  // set once the command is known: its usage follows a usage error
  try {
    return dispatch(args, out, err, terminal, &command);
  } catch (const UsageError& e) {
    const std::string name = e.command().empty() ? command : e.command();
    const CommandSpec* spec = name.empty() ? nullptr : find_command(name);
    err << "cpformer: " << e.what() << "\n" << (spec ? command_usage(*spec) : usage());
    return kExitConfig;
  } catch (const config::ConfigError& e) {
    err << e.what() << std::endl;
    return kExitConfig;
  } catch (const DataError& e) {
    err << "cpformer: data error: " << e.what() << std::endl;
    return kExitData;
  } catch (const Error& e) {
    err << "cpformer: error: " << e.message() << std::endl;
    return kExitError;
  } catch (const std::bad_alloc&) {
    // Tensor storage names its size; anything else only says std::bad_alloc.
    err << "cpformer: error: out of host memory (std::bad_alloc) in '" << (args.empty() ? "cpformer" : args[0])
        << "' outside the tensor allocator; lower the model, batch or data sizes, or raise the memory limit"
        << std::endl;
    return kExitError;
  } catch (const std::exception& e) {
    err << "cpformer: error: " << e.what() << std::endl;
    return kExitError;
  }
}

}  // namespace cpf::trainer
