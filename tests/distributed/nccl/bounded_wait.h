#pragma once
// For tests of waits that must end (NCCL timeouts, aborts, nested group creation): run the wait on a
// thread of its own and end the binary if it outlives a limit, since a hang would stall the suite.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>

namespace cpf::testing {

// Runs `body` on a thread of its own. A body still running after `limit` means the wait under test is
// not bounded: say which and end the binary.
inline void within(std::chrono::seconds limit, const char* what, const std::function<void()>& body) {
  auto done = std::async(std::launch::async, body);
  if (done.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "FATAL: %s: still waiting after %lld s; that wait has no bound\n", what,
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(3);
  }
  done.get();
}

}  // namespace cpf::testing
