// first_time_seen: the once-per-configuration log lines (attention backend, cp_mla_latent auto).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "framework/core/logging.h"

namespace cpf {
namespace {

TEST(FirstTimeSeen, TrueOnlyTheFirstTimeForATopicAndKey) {
  EXPECT_TRUE(first_time_seen("log_once_test", "a"));
  EXPECT_FALSE(first_time_seen("log_once_test", "a"));
  EXPECT_TRUE(first_time_seen("log_once_test", "b"));
  // Topics keep their keys apart: the same text under another topic is new.
  EXPECT_TRUE(first_time_seen("log_once_test/other", "a"));
  EXPECT_FALSE(first_time_seen("log_once_test/other", "a"));
}

TEST(FirstTimeSeen, ExactlyOneOfManyThreadsSeesAKeyFirst) {
  std::atomic<int> firsts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        if (first_time_seen("log_once_test/threads", std::to_string(i))) ++firsts;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(firsts.load(), 100);
}

}  // namespace
}  // namespace cpf
