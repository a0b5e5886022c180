#pragma once
// Checks after a failed thread-rank launch: what each rank threw (the launch only rethrows one), and
// how long the failure took to reach everyone.
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace cpf::testing {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Each rank's error message (empty when it had none).
class RankErrors {
 public:
  explicit RankErrors(int n) : messages_(static_cast<size_t>(n)) {}
  // Runs fn; what it throws is recorded for `rank` and thrown on.
  template <class Fn>
  void run(int rank, Fn&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      messages_[static_cast<size_t>(rank)] = e.what();
      throw;
    }
  }
  std::string at(int rank) {
    std::lock_guard lock(mutex_);
    return messages_[static_cast<size_t>(rank)];
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> messages_;
};

}  // namespace cpf::testing
