// Timeouts and error propagation: a rank that throws or never arrives must give every rank a clear
// error well within the timeout, and the process must not hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "distributed/dist_test_utils.h"
#include "distributed/rank_errors.h"
#include "framework/distributed/thread/thread_process_group.h"

namespace cpf::testing {
namespace {

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

TEST(FailureTest, AThrowingRankAbortsTheOthersAtOnce) {
  RankErrors errors(4);
  const auto start = Clock::now();
  EXPECT_CPF_ERROR(run_ranks(
                       4,
                       [&](RankContext& ctx) {
                         errors.run(ctx.rank, [&] {
                           if (ctx.rank == 2) throw std::runtime_error("boom in the data loader");
                           ctx.world->all_reduce(ones({8}));
                         });
                       },
                       std::chrono::seconds(30)),
                   "launch: rank 2 failed: boom in the data loader");
  EXPECT_LT(seconds_since(start), 5.0) << "the other ranks waited for the 30 s timeout";
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(contains(errors.at(r), "all_reduce on group 'world' aborted: rank 2 failed: boom in the data loader"));
  }
}

TEST(FailureTest, AMissingRankTimesOutNamingIt) {
  RankErrors errors(4);
  const auto start = Clock::now();
  EXPECT_CPF_ERROR(run_ranks(
                       4,
                       [&](RankContext& ctx) {
                         errors.run(ctx.rank, [&] {
                           ctx.world->barrier();
                           if (ctx.rank == 3) return;  // never arrives at the all_reduce
                           ctx.world->all_reduce(ones({8}));
                         });
                       },
                       200ms),
                   "timed out after 200 ms at step 1 waiting for ranks [3] to arrive");
  EXPECT_LT(seconds_since(start), 5.0);
  for (int r : {0, 1, 2}) {
    EXPECT_TRUE(contains(errors.at(r), "all_reduce on group 'world'")) << r;
    EXPECT_TRUE(contains(errors.at(r), "waiting for ranks [3] to arrive")) << r;
  }
  EXPECT_EQ(errors.at(3), "");
}

TEST(FailureTest, SubGroupTimeoutNamesTheGroupAndGlobalRanks) {
  RankErrors errors(4);
  EXPECT_CPF_ERROR(
      run_ranks(
          4,
          [&](RankContext& ctx) {
            errors.run(ctx.rank, [&] {
              auto pair = ctx.world->new_group({1, 3}, "pair");
              if (ctx.rank == 1) pair->all_gather(ones({2}));
            });
          },
          200ms),
      "launch: rank 1 failed: all_gather on group 'pair' timed out after 200 ms at step 0 waiting for ranks "
      "[1] (global [3]) to arrive");
}

TEST(FailureTest, AReceiveWithoutSenderTimesOut) {
  RankErrors errors(2);
  EXPECT_CPF_ERROR(
      run_ranks(
          2,
          [&](RankContext& ctx) {
            errors.run(ctx.rank, [&] {
              if (ctx.rank == 0) ctx.world->recv(zeros({3}), 1, 5);
            });
          },
          200ms),
      "recv from rank 1 (tag 5) on group 'world' timed out after 200 ms waiting for ranks [1] to send (tag 5)");
}

TEST(FailureTest, AbortReachesRanksWaitingInOtherGroupsAndReceives) {
  RankErrors errors(4);
  const auto start = Clock::now();
  EXPECT_CPF_ERROR(run_ranks(
                       4,
                       [&](RankContext& ctx) {
                         errors.run(ctx.rank, [&] {
                           auto low = ctx.world->new_group({0, 1}, "low");
                           if (ctx.rank == 0) low->all_reduce(ones({2}));      // rank 1 never joins
                           if (ctx.rank == 1) ctx.world->recv(zeros({2}), 2);  // rank 2 never sends
                           if (ctx.rank == 3) {
                             std::this_thread::sleep_for(50ms);
                             CPF_FAIL("rank 3 hit a NaN loss");
                           }
                         });
                       },
                       std::chrono::seconds(30)),
                   "launch: rank 3 failed: rank 3 hit a NaN loss");
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_TRUE(contains(errors.at(0), "all_reduce on group 'low' aborted: rank 3 failed: rank 3 hit a NaN loss"));
  EXPECT_TRUE(contains(errors.at(1), "recv from rank 2 (tag 0) on group 'world' aborted: rank 3 failed"));
}

TEST(FailureTest, AsyncErrorsArriveAtWait) {
  run_ranks(2, [](RankContext& ctx) {
    dist::WorkPtr bad = ctx.world->all_reduce_async(ones({ctx.rank + 1}));
    dist::WorkPtr good = ctx.world->all_reduce_async(ones({2}));
    EXPECT_TRUE(same_tensor(good->wait_tensor(), full({2}, 2.0)));  // waiting out of order is fine
    EXPECT_CPF_ERROR(bad->wait(), "ranks disagree on the shape: rank 0 has [1], rank 1 has [2]");
    EXPECT_CPF_ERROR(bad->wait(), "ranks disagree on the shape");  // every wait rethrows
    EXPECT_CPF_ERROR(bad->result(), "result() of an operation that failed");
  });
}

TEST(FailureTest, ExplicitAbortFailsPendingOperations) {
  RankErrors errors(3);
  EXPECT_CPF_ERROR(run_ranks(3,
                             [&](RankContext& ctx) {
                               errors.run(ctx.rank, [&] {
                                 if (ctx.rank == 0) {
                                   ctx.world->abort("operator requested shutdown");
                                   return;
                                 }
                                 ctx.world->barrier();
                               });
                             }),
                   "launch: rank 0 failed: operator requested shutdown");
  EXPECT_TRUE(contains(errors.at(1), "barrier on group 'world' aborted: rank 0 failed: operator requested shutdown"));
}

TEST(FailureTest, DestroyingTheWorldFailsPendingWorkInsteadOfHanging) {
  dist::WorkPtr pending;
  const auto start = Clock::now();
  {
    auto world = dist::thread::ThreadWorld::create(2, {.timeout = std::chrono::seconds(30)});
    auto pg0 = world->group(0);
    pending = pg0->all_reduce_async(ones({4}));  // rank 1 never calls it
  }
  EXPECT_CPF_ERROR(pending->wait(),
                   "all_reduce on group 'world' aborted: the thread world was destroyed while "
                   "operations were pending");
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(FailureTest, ExceptionsThatAreNotStdExceptionsAreReported) {
  EXPECT_CPF_ERROR(run_ranks(2,
                             [](RankContext& ctx) {
                               if (ctx.rank == 1) throw 42;
                               ctx.world->barrier();
                             }),
                   "launch: rank 1 failed: an exception that is not a std::exception");
}

}  // namespace
}  // namespace cpf::testing
