// The TCP rendezvous on localhost, ranks as threads: payload delivery, missing ranks named within
// the timeout, misconfigured peers, and the liveness channel naming a rank that vanished.
#include "framework/distributed/rendezvous_tcp.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "support/test_utils.h"

namespace cpf::testing {
namespace {

using namespace std::chrono_literals;

// Runs join() on each listed rank's thread; returns each rank's error text ("" when it succeeded).
struct Outcome {
  std::vector<std::string> errors;
  std::vector<std::string> payloads;
  std::vector<std::unique_ptr<dist::TcpRendezvous>> handles;
};

Outcome join_all(int world_size, const std::vector<int>& ranks, int port, std::chrono::milliseconds timeout,
                 const std::string& payload = "payload") {
  Outcome o;
  o.errors.resize(static_cast<size_t>(world_size));
  o.payloads.resize(static_cast<size_t>(world_size));
  o.handles.resize(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r : ranks) {
    threads.emplace_back([&, r] {
      try {
        auto rv = dist::TcpRendezvous::join({.host = "127.0.0.1",
                                             .port = port,
                                             .rank = r,
                                             .world_size = world_size,
                                             .payload = r == 0 ? payload : "",
                                             .timeout = timeout});
        o.payloads[static_cast<size_t>(r)] = rv->payload();
        o.handles[static_cast<size_t>(r)] = std::move(rv);
      } catch (const std::exception& e) {
        o.errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return o;
}

TEST(TcpRendezvous, DeliversRankZerosPayloadToEveryRank) {
  // Binary payload with zero bytes and newlines, like an ncclUniqueId.
  std::string id(128, '\0');
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7);
  const Outcome o = join_all(4, {0, 1, 2, 3}, dist::find_free_port(), 10s, id);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(o.errors[r], "") << "rank " << r;
    EXPECT_EQ(o.payloads[r], id) << "rank " << r;
  }
}

TEST(TcpRendezvous, RanksMayStartBeforeRankZero) {
  const int port = dist::find_free_port();
  std::string error1;
  std::thread late_root;
  std::thread early([&] {
    try {
      auto rv = dist::TcpRendezvous::join({.port = port, .rank = 1, .world_size = 2, .timeout = 10s});
      EXPECT_EQ(rv->payload(), "root");
    } catch (const std::exception& e) {
      error1 = e.what();
    }
  });
  std::this_thread::sleep_for(300ms);
  auto root = dist::TcpRendezvous::join({.port = port, .rank = 0, .world_size = 2, .payload = "root", .timeout = 10s});
  early.join();
  EXPECT_EQ(error1, "");
}

TEST(TcpRendezvous, MissingRanksAreNamedWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const Outcome o = join_all(4, {0, 1, 3}, dist::find_free_port(), 1500ms);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 8.0);
  for (int r : {0, 1, 3}) {
    EXPECT_NE(o.errors[r].find("ranks [2] of 4 did not arrive within the timeout of 1.5 s"), std::string::npos)
        << "rank " << r << ": " << o.errors[r];
  }
}

TEST(TcpRendezvous, RankThatCannotReachRankZeroSaysWhere) {
  const int port = dist::find_free_port();  // nobody listens there
  const Outcome o = join_all(2, {1}, port, 600ms);
  EXPECT_NE(o.errors[1].find("rank 1 could not reach rank 0 within the timeout of 0.6 s"), std::string::npos)
      << o.errors[1];
  EXPECT_NE(o.errors[1].find("127.0.0.1:" + std::to_string(port)), std::string::npos) << o.errors[1];
}

TEST(TcpRendezvous, MismatchedWorldSizeAndDuplicateRanksFailEveryone) {
  const int port = dist::find_free_port();
  std::string e0, e1;
  std::thread root([&] {
    try {
      dist::TcpRendezvous::join({.port = port, .rank = 0, .world_size = 3, .timeout = 5s});
    } catch (const std::exception& e) {
      e0 = e.what();
    }
  });
  std::thread wrong([&] {
    try {
      dist::TcpRendezvous::join({.port = port, .rank = 1, .world_size = 2, .timeout = 5s});
    } catch (const std::exception& e) {
      e1 = e.what();
    }
  });
  root.join();
  wrong.join();
  // The message names the peer's address: "rank 1 (127.0.0.1:40820) says the world has 2 ranks ...".
  for (const std::string& e : {e0, e1}) {
    EXPECT_NE(e.find("rank 1 (127.0.0.1:"), std::string::npos) << e;
    EXPECT_NE(e.find(") says the world has 2 ranks but rank 0 has 3"), std::string::npos) << e;
  }

  const int port2 = dist::find_free_port();
  const Outcome dup = [&] {
    Outcome o;
    o.errors.resize(3);
    std::vector<std::thread> ts;
    for (int i = 0; i < 3; ++i) {
      ts.emplace_back([&, i] {
        try {
          dist::TcpRendezvous::join({.port = port2, .rank = i == 0 ? 0 : 1, .world_size = 3, .timeout = 5s});
        } catch (const std::exception& e) {
          o.errors[static_cast<size_t>(i)] = e.what();
        }
      });
    }
    for (auto& t : ts) t.join();
    return o;
  }();
  EXPECT_NE(dup.errors[0].find("two processes say they are rank 1: 127.0.0.1:"), std::string::npos) << dup.errors[0];
}

TEST(TcpRendezvous, RejectsBadArguments) {
  EXPECT_CPF_ERROR(dist::TcpRendezvous::join({.port = 0, .rank = 0, .world_size = 2}), "port 0 is not a TCP port");
  EXPECT_CPF_ERROR(dist::TcpRendezvous::join({.port = 1234, .rank = 2, .world_size = 2}), "rank 2 is not in 0..1");
  EXPECT_CPF_ERROR(dist::TcpRendezvous::join({.port = 1234, .rank = 0, .world_size = 0}), "at least 1");
  // A world of one needs no network.
  EXPECT_EQ(dist::TcpRendezvous::join({.port = 1, .rank = 0, .world_size = 1, .payload = "x"})->payload(), "x");
}

// Liveness: rank 2 is a forked process that joins and then exits without destroying its handle (as
// a crash would): ranks 0 and 1 (threads here) are told that rank 2 died.
TEST(TcpRendezvous, WatchNamesARankWhoseProcessEnded) {
  const int port = dist::find_free_port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto rv = dist::TcpRendezvous::join({.port = port, .rank = 2, .world_size = 3, .timeout = 10s});
      std::this_thread::sleep_for(500ms);  // the others start watching
      rv.release();                        // no goodbye
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  Outcome o = join_all(3, {0, 1}, port, 10s);
  for (int r : {0, 1}) ASSERT_EQ(o.errors[r], "") << r;
  std::mutex mutex;
  std::map<int, std::pair<int, std::string>> seen;  // watcher rank -> (dead rank, reason)
  for (int r : {0, 1}) {
    o.handles[r]->watch([&, r](int dead, const std::string& reason) {
      std::lock_guard lock(mutex);
      seen[r] = {dead, reason};
    });
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child rank failed to join";
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard lock(mutex);
      if (seen.size() == 2) break;
    }
    std::this_thread::sleep_for(50ms);
  }
  std::lock_guard lock(mutex);
  ASSERT_EQ(seen.size(), 2u);
  for (int r : {0, 1}) {
    EXPECT_EQ(seen[r].first, 2) << "watcher " << r;
    EXPECT_NE(seen[r].second.find("ended without leaving the world"), std::string::npos) << seen[r].second;
  }
}

TEST(TcpRendezvous, FinishedRanksAreNotBlamed) {
  Outcome o = join_all(2, {0, 1}, dist::find_free_port(), 10s);
  std::atomic<int> failures{0};
  o.handles[0]->watch([&](int, const std::string&) { ++failures; });
  o.handles[1]->watch([&](int, const std::string&) { ++failures; });
  o.handles[1].reset();  // rank 1 finished: says goodbye
  std::this_thread::sleep_for(300ms);
  o.handles[0].reset();
  EXPECT_EQ(failures.load(), 0);
}

// What the watchers of some ranks saw: watcher rank -> (failed rank, reason, seconds after watching began).
class Watchers {
 public:
  void watch(Outcome& o, const std::vector<int>& ranks) {
    start_ = std::chrono::steady_clock::now();
    for (int r : ranks) {
      o.handles[static_cast<size_t>(r)]->watch([this, r](int failed, const std::string& reason) {
        std::lock_guard lock(mutex_);
        const double at = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        seen_[r] = {failed, reason, at};
      });
    }
  }
  // Waits up to 5 s until `count` watchers fired; returns what they saw.
  struct Seen {
    int rank;
    std::string reason;
    double seconds;
  };
  std::map<int, Seen> wait_for(size_t count) {
    for (int i = 0; i < 100; ++i) {
      {
        std::lock_guard lock(mutex_);
        if (seen_.size() >= count) break;
      }
      std::this_thread::sleep_for(50ms);
    }
    std::lock_guard lock(mutex_);
    return seen_;
  }

 private:
  std::mutex mutex_;
  std::chrono::steady_clock::time_point start_;
  std::map<int, Seen> seen_;
};

// A rank whose process fails with an error says so: the others are told at once (not at their op
// timeout), with the rank and its reason, while its connection is still open.
TEST(TcpRendezvous, ReportedFailureNamesTheRankAndTheReasonToEveryRank) {
  Watchers watchers;  // outlives the handles whose callbacks use it
  Outcome o = join_all(3, {0, 1, 2}, dist::find_free_port(), 10s);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(o.errors[r], "") << r;
  watchers.watch(o, {0, 1, 2});
  o.handles[1]->report_failure("corrupt checkpoint\nstep_100.bin");
  o.handles[1]->report_failure("a second report is not sent");
  std::map<int, Watchers::Seen> seen = watchers.wait_for(2);
  std::this_thread::sleep_for(200ms);  // rank 1's own watcher has had time to (wrongly) fire
  seen = watchers.wait_for(2);
  ASSERT_EQ(seen.size(), 2u) << "rank 1's own watcher must stay quiet; the others must fire";
  for (int r : {0, 2}) {
    ASSERT_EQ(seen.count(r), 1u) << "watcher " << r;
    EXPECT_EQ(seen[r].rank, 1) << "watcher " << r;
    EXPECT_EQ(seen[r].reason, "its process reported: corrupt checkpoint step_100.bin") << "watcher " << r;
    EXPECT_LT(seen[r].seconds, 1.0) << "watcher " << r;
  }
  for (auto& h : o.handles) h.reset();
}

TEST(TcpRendezvous, RankZerosReportedFailureReachesEveryRank) {
  Watchers watchers;  // outlives the handles whose callbacks use it
  Outcome o = join_all(3, {0, 1, 2}, dist::find_free_port(), 10s);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(o.errors[r], "") << r;
  watchers.watch(o, {0, 1, 2});
  o.handles[0]->report_failure("disk full writing the run folder");
  std::map<int, Watchers::Seen> seen = watchers.wait_for(2);
  std::this_thread::sleep_for(200ms);
  seen = watchers.wait_for(2);
  ASSERT_EQ(seen.size(), 2u) << "rank 0's own watcher must stay quiet; the others must fire";
  for (int r : {1, 2}) {
    ASSERT_EQ(seen.count(r), 1u) << "watcher " << r;
    EXPECT_EQ(seen[r].rank, 0) << "watcher " << r;
    EXPECT_EQ(seen[r].reason, "its process reported: disk full writing the run folder") << "watcher " << r;
    EXPECT_LT(seen[r].seconds, 1.0) << "watcher " << r;
  }
}

// Rank 2 is a forked process whose error handler reports through report_failure_to_peers() (it
// cannot reach the rendezvous, which the world group owns), then ends.
TEST(TcpRendezvous, ProcessWideReportReachesThePeers) {
  const int port = dist::find_free_port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto rv = dist::TcpRendezvous::join({.port = port, .rank = 2, .world_size = 3, .timeout = 10s});
      std::this_thread::sleep_for(500ms);  // the others start watching
      const int reported = dist::report_failure_to_peers("cannot read checkpoint step_100.bin");
      std::this_thread::sleep_for(300ms);
      rv.reset();
      ::_exit(reported == 1 ? 0 : 3);
    } catch (...) {
      ::_exit(1);
    }
  }
  Watchers watchers;  // outlives the handles whose callbacks use it
  Outcome o = join_all(3, {0, 1}, port, 10s);
  for (int r : {0, 1}) ASSERT_EQ(o.errors[r], "") << r;
  watchers.watch(o, {0, 1});
  std::map<int, Watchers::Seen> seen = watchers.wait_for(2);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status)) << "the child rank did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the child failed to join; 3: report_failure_to_peers did not count 1";
  ASSERT_EQ(seen.size(), 2u);
  for (int r : {0, 1}) {
    EXPECT_EQ(seen[r].rank, 2) << "watcher " << r;
    EXPECT_EQ(seen[r].reason, "its process reported: cannot read checkpoint step_100.bin") << "watcher " << r;
    EXPECT_LT(seen[r].seconds, 1.5) << "watcher " << r;
  }
}

// Rank 2 is a forked process whose rendezvous is destroyed by an exception's unwinding (as when the
// training throws on that rank only): the others hear that it failed, not that it finished or died.
TEST(TcpRendezvous, UnwindingProcessIsNamedAsFailed) {
  const int port = dist::find_free_port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto rv = dist::TcpRendezvous::join({.port = port, .rank = 2, .world_size = 3, .timeout = 10s});
      std::this_thread::sleep_for(500ms);
      throw std::runtime_error("disk error");
    } catch (const std::runtime_error&) {
      std::this_thread::sleep_for(300ms);  // alive a while: the notice, not the closed socket, names it
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  Watchers watchers;  // outlives the handles whose callbacks use it
  Outcome o = join_all(3, {0, 1}, port, 10s);
  for (int r : {0, 1}) ASSERT_EQ(o.errors[r], "") << r;
  watchers.watch(o, {0, 1});
  std::map<int, Watchers::Seen> seen = watchers.wait_for(2);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child rank failed to join";
  ASSERT_EQ(seen.size(), 2u);
  for (int r : {0, 1}) {
    EXPECT_EQ(seen[r].rank, 2) << "watcher " << r;
    EXPECT_NE(seen[r].reason.find("left the world while an exception was propagating"), std::string::npos)
        << "watcher " << r << ": " << seen[r].reason;
    EXPECT_LT(seen[r].seconds, 1.5) << "watcher " << r;
  }
}

// Destroyed inside a catch handler, the exception is handled, not propagating: a normal goodbye.
TEST(TcpRendezvous, ACaughtExceptionIsNotAFailure) {
  Watchers watchers;  // outlives the handles whose callbacks use it
  Outcome o = join_all(3, {0, 1, 2}, dist::find_free_port(), 10s);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(o.errors[r], "") << r;
  watchers.watch(o, {0, 1, 2});
  try {
    throw std::runtime_error("handled");
  } catch (const std::runtime_error&) {
    o.handles[2].reset();
  }
  o.handles[1].reset();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(watchers.wait_for(0).size(), 0u);
  o.handles[0].reset();
}

}  // namespace
}  // namespace cpf::testing
