// cpformer: train, generate, check-config (apps/trainer/cli.h).
#include <unistd.h>

#include <iostream>

#include "apps/trainer/cli.h"
#include "apps/trainer/fatal_handler.h"

int main(int argc, char** argv) {
  cpf::trainer::install_fatal_handler();
  std::vector<std::string> args(argv + 1, argv + argc);
  return cpf::trainer::run_cli(args, std::cout, std::cerr, isatty(STDOUT_FILENO) != 0);
}
