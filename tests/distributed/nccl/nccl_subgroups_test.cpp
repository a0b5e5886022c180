// Sub-groups of sub-groups over NCCL, in process (dist::launch with Backend::nccl, one rank per GPU):
// the nesting scenario of distributed/subgroup_nesting.h on 4 and on 8 ranks (skipped, saying why,
// on machines with fewer GPUs), dropping a sub-group mid-run (once a deadlock), and the bounded
// waits of group creation: a member that never calls a nested new_group is named, ranks that ask
// for different groups fail at once, and the default deadline ends before the test harness's.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>

#include "distributed/rank_errors.h"
#include "distributed/subgroup_nesting.h"
#include "tests/distributed/nccl/bounded_wait.h"
#include "tests/distributed/nccl/nccl_test_utils.h"

namespace cpf::testing {
namespace {

// The scenario on n NCCL ranks, or a skip naming what is missing.
void nest_on_nccl_ranks(int n) {
  const int gpus = cuda::device_count();
  if (gpus < n) {
    GTEST_SKIP() << "needs " << n << " GPUs (the nccl backend runs one rank per GPU), " << gpus
                 << " visible: runs on the " << n << "-GPU machines; the same scenario runs on " << n
                 << " thread ranks in distributed_subgroup_nesting_test";
  }
  within(120s, "nested sub-groups", [&] { run_nccl(n, [](RankContext& ctx) { nest_subgroups(ctx); }); });
}

TEST(NcclSubGroups, NestedOnFourRanks) { nest_on_nccl_ranks(4); }

TEST(NcclSubGroups, NestedOnEightRanks) { nest_on_nccl_ranks(8); }

class NcclSubGroupsOnTwo : public MultiGpuTest {};

TEST_F(NcclSubGroupsOnTwo, DroppingASubGroupMidRunDoesNotStallTheNextCollective) {
  // Both ranks' handles on a two-rank group go, then the world runs a barrier and an all_reduce.
  // NCCL frees both ranks' communicators in the second ncclCommDestroy and waits for both GPUs, one
  // of which already runs the barrier that needs the destroying rank: this deadlocked until groups
  // kept their communicators until the rank ends.
  within(60s, "a world collective after dropping a sub-group", [] {
    run_nccl(2, [](RankContext& ctx) {
      for (int i = 0; i < 3; ++i) {
        {
          auto reversed = ctx.world->new_group({1, 0}, "reversed");
          ASSERT_NE(reversed, nullptr);
          EXPECT_EQ(reversed->rank(), 1 - ctx.rank);
          const Tensor mine = raw::to(full({1}, ctx.rank, {.dtype = DType::i32}), ctx.device);
          const Tensor gathered = raw::to(reversed->all_gather(mine), Device::cpu());
          EXPECT_EQ(gathered.to_vector<int32_t>(), (std::vector<int32_t>{1, 0})) << "iteration " << i;
        }
        ctx.world->barrier();
        const Tensor sum = raw::to(ctx.world->all_reduce(raw::to(full({2}, 1.0), ctx.device)), Device::cpu());
        EXPECT_EQ(sum.to_vector<float>(), (std::vector<float>{2, 2})) << "iteration " << i;
      }
    });
  });
}

TEST_F(NcclSubGroupsOnTwo, NestedNewGroupThatAMemberNeverCallsNamesTheRank) {
  // 'pair' lists the world backwards, so global rank 1 is its rank 0. Global rank 0 asks 'pair' for
  // a group, global rank 1 never does: rank 0's wait ends at the 2 s timeout naming the group, the
  // operation and the absent rank, and the abort releases rank 1.
  std::atomic<bool> rank0_done{false};
  const auto start = std::chrono::steady_clock::now();
  within(60s, "a nested new_group with a member that never calls it", [&] {
    EXPECT_CPF_ERROR(run_nccl(
                         2,
                         [&](RankContext& ctx) {
                           auto pair = ctx.world->new_group({1, 0}, "pair");
                           if (ctx.rank == 1) {
                             while (!rank0_done.load() && seconds_since(start) < 30.0)
                               std::this_thread::sleep_for(10ms);
                             return;
                           }
                           try {
                             (void)pair->new_group({0, 1}, "inner");
                           } catch (...) {
                             rank0_done = true;
                             throw;
                           }
                           rank0_done = true;
                         },
                         2s),
                     "launch: rank 0 failed: new_group on group 'pair': rank 0 (global 1) did not arrive at "
                     "new_group #1 on this group (before ncclCommSplit into 'inner') within the timeout of 2 s; "
                     "every rank of group 'pair' (global ranks [1,0]) must call new_group with the same ranks");
  });
  EXPECT_LT(seconds_since(start), 20.0) << "the 2 s timeout should end it";
}

TEST_F(NcclSubGroupsOnTwo, RanksAskingForDifferentGroupsFailAtOnce) {
  // Same ranks, different names: ncclCommSplit cannot tell, the meeting before it can. Both ranks
  // fail naming the other, well before the 30 s timeout.
  std::mutex mutex;
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  within(60s, "new_group with different names", [&] {
    EXPECT_CPF_ERROR(run_nccl(
                         2,
                         [&](RankContext& ctx) {
                           try {
                             (void)ctx.world->new_group({0, 1}, ctx.rank == 0 ? "a" : "b");
                           } catch (const std::exception& e) {
                             std::lock_guard lock(mutex);
                             errors[static_cast<size_t>(ctx.rank)] = e.what();
                             throw;
                           }
                         },
                         30s),
                     "called new_group with other ranks, another name or at another point than");
  });
  EXPECT_LT(seconds_since(start), 20.0) << "a disagreement should not wait for the timeout";
  std::lock_guard lock(mutex);
  // Whichever rank compares first names the other; the second rank then fails either by its own comparison
  // or through the world's abort, which carries the first rank's message. So each rank's error holds one of
  // the two exact detections.
  const std::string seen_by_0 =
      "new_group on group 'world': rank 1 (global 1) called new_group with other ranks, another name or at another "
      "point than rank 0 (global 0) (ranks [0,1], name 'a', new_group #1";
  const std::string seen_by_1 =
      "new_group on group 'world': rank 0 (global 0) called new_group with other ranks, another name or at another "
      "point than rank 1 (global 1) (ranks [0,1], name 'b', new_group #1";
  for (const std::string& error : errors) {
    EXPECT_TRUE(error.find(seen_by_0) != std::string::npos || error.find(seen_by_1) != std::string::npos) << error;
  }
}

TEST(NcclSubGroups, DefaultDeadlinesEndBeforeTheTestHarnessGivesUp) {
  // ctest (CMakePresets.json) and scripts/gpu/run_suite.sh (TEST_TIMEOUT) stop a test at 300 s: a
  // wait under the defaults must have reported itself by then.
  const dist::NcclInitOptions defaults;
  EXPECT_LT(defaults.timeout, std::chrono::seconds(300));
  EXPECT_LT(defaults.rendezvous_timeout, std::chrono::seconds(300));
  EXPECT_LT(dist::LaunchOptions{}.timeout, std::chrono::seconds(300));
}

}  // namespace
}  // namespace cpf::testing
