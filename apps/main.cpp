// cpformer: train, generate, check-config (apps/cli/cli.h).
#include <unistd.h>

#include <iostream>

#include "apps/cli/cli.h"
#include "apps/cli/fatal_handler.h"

int main(int argc, char** argv) {
  cpf::trainer::install_fatal_handler();
  std::vector<std::string> args(argv + 1, argv + argc);
  return cpf::trainer::run_cli(args, std::cout, std::cerr, isatty(STDOUT_FILENO) != 0);
}
