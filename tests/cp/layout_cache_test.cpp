// cached_group_layout: the same layout make_group_layout builds, shared for an equal key, rebuilt for
// any difference (lengths, slots, positions, CP size, members), and only the last few kept.
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
  for (const auto& other : {cached_group_layout(batch(12, 16), 2, {0, 1}), cached_group_layout(batch(13, 24), 2, {0, 1}),
                            cached_group_layout(g, 4, {0, 1}), cached_group_layout(g, 2, {1, 0}),
                            cached_group_layout(positions, 2, {0, 1})}) {
    EXPECT_NE(other.get(), base.get());
  }
  expect_same_layout(*cached_group_layout(positions, 2, {0, 1}), make_group_layout(positions, 2, {0, 1}));
}

TEST(LayoutCache, KeepsOnlyTheLastEntries) {
  const GlobalSequences g = batch(16, 16);
  const auto oldest = cached_group_layout(g, 2, {0});
  for (int64_t real = 1; real <= static_cast<int64_t>(kLayoutCacheEntries); ++real) cached_group_layout(batch(real, 16), 2, {0});
  const auto again = cached_group_layout(g, 2, {0});  // evicted: built anew, equal
  EXPECT_NE(again.get(), oldest.get());
  expect_same_layout(*again, *oldest);
}

}  // namespace
}  // namespace cpf::cp
