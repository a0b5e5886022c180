// Sub-groups of sub-groups on thread ranks: the nesting scenario of subgroup_nesting.h on 4 and 8
// ranks, and the bounded waits of nested group creation: a member that never calls a nested
// new_group, or calls it with other ranks, is named with the group and the operation. split makes many
// disjoint groups in one collective: each rank gets its part, whose collectives stay inside it; a
// partition that overlaps, misses a rank or differs between ranks is refused by name.
#include <gtest/gtest.h>

#include "distributed/rank_errors.h"
#include "distributed/subgroup_nesting.h"

namespace cpf::testing {
namespace {

TEST(SubGroupNesting, FourThreadRanks) {
  run_ranks(4, [](RankContext& ctx) { nest_subgroups(ctx); });
}

TEST(SubGroupNesting, EightThreadRanks) {
  run_ranks(8, [](RankContext& ctx) { nest_subgroups(ctx); });
}

TEST(SubGroupNesting, AMemberThatNeverCallsANestedNewGroupIsNamed) {
  // 'high' = world ranks [3,2]: global 3 is its rank 0, global 2 its rank 1. Global 3 asks 'high'
  // for a pair, global 2 never does: the wait ends at the 200 ms timeout naming the group, the
  // operation and global 2, and the abort ends everyone else's waits.
  RankErrors errors(4);
  const auto start = Clock::now();
  EXPECT_CPF_ERROR(run_ranks(
                       4,
                       [&](RankContext& ctx) {
                         errors.run(ctx.rank, [&] {
                           auto low = ctx.world->new_group({0, 1}, "low");
                           auto high = ctx.world->new_group({3, 2}, "high");
                           if (ctx.rank == 3) (void)high->new_group({1, 0}, "pair");
                         });
                       },
                       200ms),
                   "launch: rank 3 failed: new_group on group 'high' timed out after 200 ms at step 0 waiting for "
                   "ranks [1] (global [2]) to arrive");
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(errors.at(2), "") << "rank 2 returned before the timeout";
}

TEST(SubGroupNesting, MembersThatAskForDifferentNestedGroupsAreNamed) {
  // Inside 'high', its rank 0 (global 3) lists [1,0] and its rank 1 (global 2) lists [0,1]: every
  // member fails at once with the disagreement, none waits for the timeout.
  RankErrors errors(4);
  const auto start = Clock::now();
  EXPECT_CPF_ERROR(run_ranks(
                       4,
                       [&](RankContext& ctx) {
                         errors.run(ctx.rank, [&] {
                           auto high = ctx.world->new_group({3, 2}, "high");
                           if (high)
                             (void)high->new_group(ctx.rank == 3 ? std::vector<int>{1, 0} : std::vector<int>{0, 1});
                         });
                       },
                       std::chrono::seconds(20)),
                   "new_group on group 'high'");
  EXPECT_LT(seconds_since(start), 5.0) << "a disagreement should not wait for the timeout";
  for (int r : {2, 3}) {
    EXPECT_NE(errors.at(r).find("new_group on group 'high': ranks disagree on the member ranks: rank 0 has [1,0], "
                                "rank 1 has [0,1]"),
              std::string::npos)
        << "rank " << r << ": " << errors.at(r);
  }
}

TEST(SubGroupNesting, DefaultDeadlineEndsBeforeTheTestHarnessGivesUp) {
  // ctest (CMakePresets.json) and scripts/gpu/run_suite.sh stop a test at 300 s: a wait under the
  // default timeout must have reported itself by then.
  EXPECT_LT(dist::kDefaultTimeout, std::chrono::seconds(300));
  EXPECT_EQ(dist::LaunchOptions{}.timeout, dist::kDefaultTimeout);
}

TEST(SubGroupSplit, EveryRankGetsItsPartInOneCollective) {
  run_ranks(6, [](RankContext& ctx) {
    // Parts of different sizes, members out of order: {4, 1}, {0, 2, 5}, {3}.
    const std::vector<std::vector<int>> parts = {{4, 1}, {0, 2, 5}, {3}};
    const dist::ProcessGroupPtr group = ctx.world->split(parts, "part");
    ASSERT_NE(group, nullptr);
    for (const auto& part : parts) {
      const auto at = std::find(part.begin(), part.end(), ctx.rank);
      if (at == part.end()) continue;
      EXPECT_EQ(group->size(), static_cast<int>(part.size()));
      EXPECT_EQ(group->rank(), static_cast<int>(at - part.begin()));
      EXPECT_EQ(group->global_ranks(), part);
      // The sum of the members' global ranks: the collective stays inside the part.
      int64_t expected = 0;
      for (int r : part) expected += r;
      const Tensor sum = group->all_reduce(full({1}, static_cast<double>(ctx.rank)));
      EXPECT_EQ(sum.item<double>(), static_cast<double>(expected));
    }
  });
}

TEST(SubGroupSplit, BadPartitionsAreRefused) {
  run_ranks(3, [](RankContext& ctx) {
    auto& pg = *ctx.world;
    EXPECT_CPF_ERROR(pg.split({{0, 1}, {1, 2}}), "split on group 'world': rank 1 is in parts 0 and 1");
    EXPECT_CPF_ERROR(pg.split({{0, 1}}), "split on group 'world': rank 2 is in no part; every rank needs one");
    EXPECT_CPF_ERROR(pg.split({{0, 1, 2}, {}}), "split on group 'world': part 1 is empty");
    EXPECT_CPF_ERROR(pg.split({{0, 1, 3}, {2}}), "rank 3 is out of range for a group of size 3");
    EXPECT_CPF_ERROR(pg.split(ctx.rank == 2 ? std::vector<std::vector<int>>{{0}, {1, 2}}
                                            : std::vector<std::vector<int>>{{0, 1}, {2}}),
                     "ranks disagree on the partition");
  });
}

}  // namespace
}  // namespace cpf::testing
