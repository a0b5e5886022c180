// cached_group_layout and cached_rank_layouts: the same layouts make_group_layout builds, shared for an
// equal key, rebuilt for any difference (lengths, slots, positions, CP size, members), and only the last few kept.
#include <gtest/gtest.h>

#include "attention/cp/layout_cache.h"

#include <memory>
#include <string>

#include "framework/core/error.h"

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

// The tiles equal what the ring made per step; a repeat is shared; another window, rank or layouts
// object gets its own (a sliding window that hides a whole step must not be served a causal answer).
void expect_tiles_of(const std::vector<RingTile>& tiles, const std::vector<GroupLayout>& layouts, int me,
                     const AttentionWindow& window) {
  ASSERT_EQ(tiles.size(), layouts.size());
  for (size_t s = 0; s < layouts.size(); ++s) {
    const bool visible = any_visible(layouts[me], layouts[s], window);
    EXPECT_EQ(tiles[s].visible, visible) << "source " << s;
    if (!visible) continue;
    const SequenceInfo want = pair_sequence_info(layouts[me], layouts[s]);
    EXPECT_EQ(tiles[s].pair.cu_seqlens_q, want.cu_seqlens_q);
    EXPECT_EQ(tiles[s].pair.cu_seqlens_kv_padded, want.cu_seqlens_kv_padded);
    EXPECT_EQ(tiles[s].pair.q_positions, want.q_positions);
    EXPECT_EQ(tiles[s].pair.kv_positions, want.kv_positions);
  }
}

TEST(LayoutCache, RingTilesAreTheStepsVisibilityAndPairInfos) {
  const auto layouts = cached_rank_layouts(batch(64, 64), 4);  // chunks of 8 tokens
  const AttentionWindow causal{-1, 0}, narrow{4, 0};
  const auto first = cached_ring_tiles(layouts, 1, causal);
  expect_tiles_of(*first, *layouts, 1, causal);
  EXPECT_EQ(cached_ring_tiles(layouts, 1, causal).get(), first.get());
  // Rank 1 (chunks 1 and 6) sees rank 3 (chunks 3 and 4) causally, but not within 4 positions.
  EXPECT_TRUE((*first)[3].visible);
  const auto windowed = cached_ring_tiles(layouts, 1, narrow);
  EXPECT_NE(windowed.get(), first.get());
  EXPECT_FALSE((*windowed)[3].visible);
  expect_tiles_of(*windowed, *layouts, 1, narrow);
  const auto other_rank = cached_ring_tiles(layouts, 2, causal);
  EXPECT_NE(other_rank.get(), first.get());
  expect_tiles_of(*other_rank, *layouts, 2, causal);
  // Equal layouts in another object: keyed by the object, so built again (with equal contents).
  const auto copy = std::make_shared<const std::vector<GroupLayout>>(*layouts);
  const auto from_copy = cached_ring_tiles(copy, 1, causal);
  EXPECT_NE(from_copy.get(), first.get());
  expect_tiles_of(*from_copy, *copy, 1, causal);
}

TEST(LayoutCache, RingTilesOfAnotherBatchAreItsOwn) {
  const AttentionWindow causal{-1, 0};
  const auto a = cached_rank_layouts(batch(64, 64), 4);
  const auto b = cached_rank_layouts(batch(40, 64), 4);  // 24 padded tokens: other lengths
  for (int round = 0; round < 2; ++round) {
    expect_tiles_of(*cached_ring_tiles(a, 0, causal), *a, 0, causal);
    expect_tiles_of(*cached_ring_tiles(b, 0, causal), *b, 0, causal);
  }
  EXPECT_NE((*cached_ring_tiles(a, 0, causal))[0].pair.cu_seqlens_q,
            (*cached_ring_tiles(b, 0, causal))[0].pair.cu_seqlens_q);
}

TEST(LayoutCache, RingTilesRejectARankOutsideTheLayouts) {
  const auto layouts = cached_rank_layouts(batch(64, 64), 4);
  try {
    cached_ring_tiles(layouts, 4, {-1, 0});
    ADD_FAILURE() << "rank 4 of 4 layouts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cached_ring_tiles: rank 4 is not one of the 4 layouts"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cpf::cp
