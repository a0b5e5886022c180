// cached_group_layout and cached_rank_layouts: the same layouts make_group_layout builds, shared for an
// equal key, rebuilt for any difference (lengths, slots, positions, CP size, members), and only the last few kept.
#include <gtest/gtest.h>

#include "attention/cp/layout_cache.h"

namespace cpf::cp {
namespace {

GlobalSequences batch(int64_t real, int64_t slot) {
  GlobalSequences g;
  g.cu_seqlens = {0, real};
  g.cu_seqlens_padded = {0, slot};
  return g;
}

void expect_same_layout(const GroupLayout& a, const GroupLayout& b) {
  EXPECT_EQ(a.members, b.members);
  EXPECT_EQ(a.global_index, b.global_index);
  EXPECT_EQ(a.slot_index, b.slot_index);
  EXPECT_EQ(a.to_sequence_major, b.to_sequence_major);
  EXPECT_EQ(a.info.cu_seqlens_q, b.info.cu_seqlens_q);
  EXPECT_EQ(a.info.q_positions, b.info.q_positions);
  EXPECT_EQ(a.info.kv_positions, b.info.kv_positions);
}

TEST(LayoutCache, EqualKeysShareOneLayout) {
  const GlobalSequences g = batch(13, 16);
  const auto first = cached_group_layout(g, 2, {0, 1});
  expect_same_layout(*first, make_group_layout(g, 2, {0, 1}));
  EXPECT_EQ(cached_group_layout(g, 2, {0, 1}).get(), first.get());
}

TEST(LayoutCache, AnyDifferenceInTheKeyBuildsAnother) {
  const GlobalSequences g = batch(13, 16);
  const auto base = cached_group_layout(g, 2, {0, 1});
  GlobalSequences positions = g;
  positions.q_positions.resize(16);
  positions.kv_positions.resize(16);
  for (int64_t i = 0; i < 16; ++i) positions.q_positions[i] = positions.kv_positions[i] = 2 * i;
  for (const auto& other : {cached_group_layout(batch(12, 16), 2, {0, 1}),
                            cached_group_layout(batch(13, 24), 2, {0, 1}), cached_group_layout(g, 4, {0, 1}),
                            cached_group_layout(g, 2, {1, 0}), cached_group_layout(positions, 2, {0, 1})}) {
    EXPECT_NE(other.get(), base.get());
  }
  expect_same_layout(*cached_group_layout(positions, 2, {0, 1}), make_group_layout(positions, 2, {0, 1}));
}

TEST(LayoutCache, KeepsOnlyTheLastEntries) {
  const GlobalSequences g = batch(16, 16);
  const auto oldest = cached_group_layout(g, 2, {0});
  for (int64_t real = 1; real <= static_cast<int64_t>(kLayoutCacheEntries); ++real)
    cached_group_layout(batch(real, 16), 2, {0});
  const auto again = cached_group_layout(g, 2, {0});  // evicted: built anew, equal
  EXPECT_NE(again.get(), oldest.get());
  expect_same_layout(*again, *oldest);
}

TEST(LayoutCache, RankLayoutsAreTheSingleRankLayoutsSharedForAnEqualKey) {
  const GlobalSequences g = batch(13, 16);
  const auto ranks = cached_rank_layouts(g, 4);
  ASSERT_EQ(ranks->size(), 4u);
  for (int r = 0; r < 4; ++r) expect_same_layout((*ranks)[static_cast<size_t>(r)], make_group_layout(g, 4, {r}));
  EXPECT_EQ(cached_rank_layouts(g, 4).get(), ranks.get());
  const auto two = cached_rank_layouts(g, 2);  // another CP size: another entry
  EXPECT_NE(two.get(), ranks.get());
  EXPECT_EQ(two->size(), 2u);
  EXPECT_NE(cached_rank_layouts(batch(12, 16), 4).get(), ranks.get());
}

}  // namespace
}  // namespace cpf::cp
