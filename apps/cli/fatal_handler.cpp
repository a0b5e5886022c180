#include "apps/cli/fatal_handler.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

namespace cpf::trainer {
namespace {

// Constant strings where memory may be exhausted: nothing here allocates except what() itself.
[[noreturn]] void report_terminate() {
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      std::fputs(
          "cpformer: fatal: out of host memory (std::bad_alloc) in a thread that cannot report it; lower the "
          "model or batch size or the rank count, or raise the memory limit\n",
          stderr);
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

void install_fatal_handler() { std::set_terminate(report_terminate); }

}  // namespace cpf::trainer
