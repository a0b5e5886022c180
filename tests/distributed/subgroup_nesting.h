#pragma once
// Sub-groups of sub-groups, the same scenario on any backend (thread ranks on the CPU, NCCL ranks on
// GPUs), on n ranks (a multiple of 4):
//
//   world (n) -> halves: 'low' = [0 .. n/2-1], 'high' = [n-1 .. n/2] (reversed: global n-1 is rank 0)
//             -> pairs of each half, each listed backwards ({2p+1, 2p}: the new rank 0 is the old 2p+1)
//             -> 'solo': the pair's rank 1 alone
//
// Every rank calls every new_group of each group it belongs to (collective over the parent), and
// non-members get null. At each level the ranks, sizes, global ranks and an all_reduce are checked
// against what the definitions above say. The inner groups are then dropped mid-run and the world
// runs collectives again (dropping a group of several ranks of one process once deadlocked the next
// world collective under NCCL), and the whole nesting runs twice on the same parents.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "distributed/dist_test_utils.h"

namespace cpf::testing {

// (global rank + 1) summed over `globals`: what an all_reduce of full({3}, global + 1) gives.
inline float sum_of_ranks_plus_one(const std::vector<int>& globals) {
  float sum = 0;
  for (int g : globals) sum += static_cast<float>(g + 1);
  return sum;
}

// Checks `group` (this rank's handle, or null) against the members it should have, by global rank.
inline void check_subgroup(const dist::ProcessGroupPtr& group, const std::vector<int>& globals, int global_rank,
                           Device device, const std::string& where) {
  const auto at = std::find(globals.begin(), globals.end(), global_rank);
  if (at == globals.end()) {
    EXPECT_EQ(group, nullptr) << where << ": a non-member got a group";
    return;
  }
  ASSERT_NE(group, nullptr) << where << ": a member got no group";
  EXPECT_EQ(group->size(), static_cast<int>(globals.size())) << where;
  EXPECT_EQ(group->rank(), static_cast<int>(at - globals.begin())) << where;
  EXPECT_EQ(group->global_ranks(), globals) << where;
  EXPECT_EQ(group->global_rank(), global_rank) << where;
  const Tensor x = raw::to(full({3}, static_cast<double>(global_rank + 1)), device);
  const std::vector<float> sum = raw::to(group->all_reduce(x), Device::cpu()).to_vector<float>();
  EXPECT_EQ(sum, std::vector<float>(3, sum_of_ranks_plus_one(globals))) << where << ": all_reduce";
}

// One round of the scenario on this rank; `round` only labels failures.
inline void nest_subgroups_once(RankContext& ctx, int round) {
  const int n = ctx.world_size;
  ASSERT_EQ(n % 4, 0) << "the scenario needs a multiple of 4 ranks, got " << n;
  const std::string tag =
      "n=" + std::to_string(n) + " round " + std::to_string(round) + " rank " + std::to_string(ctx.rank) + ": ";
  std::vector<int> low_ranks, high_ranks;
  for (int r = 0; r < n / 2; ++r) low_ranks.push_back(r);
  for (int r = n - 1; r >= n / 2; --r) high_ranks.push_back(r);
  const auto low = ctx.world->new_group(low_ranks, "low");
  const auto high = ctx.world->new_group(high_ranks, "high");
  check_subgroup(low, low_ranks, ctx.rank, ctx.device, tag + "low");
  check_subgroup(high, high_ranks, ctx.rank, ctx.device, tag + "high");
  const dist::ProcessGroupPtr half = ctx.rank < n / 2 ? low : high;
  ASSERT_NE(half, nullptr);
  {
    const int m = half->size();
    dist::ProcessGroupPtr my_pair;
    std::vector<int> my_pair_globals;
    for (int p = 0; p < m / 2; ++p) {
      const std::vector<int> members{2 * p + 1, 2 * p};  // ranks of the half, backwards
      const std::vector<int> globals{half->global_ranks()[members[0]], half->global_ranks()[members[1]]};
      auto pair = half->new_group(members, "pair" + std::to_string(p));
      check_subgroup(pair, globals, ctx.rank, ctx.device, tag + "pair" + std::to_string(p));
      if (pair) {
        my_pair = pair;
        my_pair_globals = globals;
      }
    }
    ASSERT_NE(my_pair, nullptr) << tag << "in no pair";
    // A group of one, three levels down: the pair's rank 1 is global my_pair_globals[1].
    auto solo = my_pair->new_group({1}, "solo");
    check_subgroup(solo, {my_pair_globals[1]}, ctx.rank, ctx.device, tag + "solo");
  }  // the pairs and solos are dropped here, mid-run
  const Tensor one = raw::to(full({3}, 1.0), ctx.device);
  const std::vector<float> world_sum = raw::to(ctx.world->all_reduce(one), Device::cpu()).to_vector<float>();
  EXPECT_EQ(world_sum, std::vector<float>(3, static_cast<float>(n))) << tag << "world all_reduce after dropping";
  ctx.world->barrier();
}

// The whole scenario: twice, so new groups are made on parents that already made some.
inline void nest_subgroups(RankContext& ctx) {
  for (int round = 0; round < 2; ++round) nest_subgroups_once(ctx, round);
}

}  // namespace cpf::testing
