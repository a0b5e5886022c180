// cpformer: train, generate, check-config (apps/trainer/cli.h).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>

#include "apps/trainer/cli.h"

namespace {

// An exception escaping a thread (a progress thread, an OpenMP region) or a thread left running ends
// the process through std::terminate, whose own words ("terminate called without an active
// exception") name nothing. Say what failed, then abort as terminate would (a non-zero exit).
[[noreturn]] void report_terminate() {
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      std::fputs("cpformer: fatal: out of host memory (std::bad_alloc) in a thread that cannot report it; lower the "
                 "model or batch size or the rank count, or raise the memory limit\n", stderr);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "cpformer: fatal: uncaught exception in a thread that cannot report it: %s\n", ex.what());
    } catch (...) {
      std::fputs("cpformer: fatal: uncaught exception (not a std::exception) in a thread that cannot report it\n",
                 stderr);
    }
  } else {
    std::fputs("cpformer: fatal: std::terminate without an exception (a thread was left running)\n", stderr);
  }
  std::abort();
}

}  // namespace

int main(int argc, char** argv) {
  std::set_terminate(report_terminate);
  std::vector<std::string> args(argv + 1, argv + argc);
  return cpf::trainer::run_cli(args, std::cout, std::cerr, isatty(STDOUT_FILENO) != 0);
}
