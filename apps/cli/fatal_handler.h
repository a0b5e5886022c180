#pragma once
// The last resort for failures no code can catch: an exception escaping a thread (a progress thread,
// an OpenMP region) or a thread left running ends the process through std::terminate, whose own words
// ("terminate called without an active exception") name nothing. install_fatal_handler() makes it say
// what failed ("cpformer: fatal: out of host memory (std::bad_alloc) ...") before aborting as
// terminate would, so the exit is still non-zero (SIGABRT).
namespace cpf::trainer {

void install_fatal_handler();

}  // namespace cpf::trainer
