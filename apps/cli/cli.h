#pragma once
// The `cpformer` command line: train, generate, check-config, plot, docs (the table of commands and
// their options is command_table.h; `cpformer --help`, `cpformer COMMAND --help`, `cpformer --version`).
//
// Exit codes: 0 success; 1 a runtime error; 2 a config or usage error (one line
// "file:line:column: key.path=value problem"); 3 data that cannot be read (missing, empty, truncated or
// malformed files); 4 a training target (run.target_accuracy / run.target_loss) was not reached.
#include <ostream>
#include <string>
#include <vector>

namespace cpf::trainer {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitConfig = 2;
inline constexpr int kExitData = 3;
inline constexpr int kExitTargetMissed = 4;

// args exclude the program name. `terminal`: stdout is a terminal (progress bar).
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool terminal = false);

std::string usage();  // `cpformer --help` (command_table.cpp)

}  // namespace cpf::trainer
