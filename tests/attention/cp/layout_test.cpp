// Group layouts (attention/cp/layout.h): gathered sequences in position order, and the query split of a
// rank's two chunks into one call per run (what all_gather and cuDNN's index-based masks need).
#include <gtest/gtest.h>

#include "attention/cp/layout.h"

namespace cpf::cp {
namespace {

// Two sequences of 16 and 8 real tokens in slots of 16 (multiples of 2 * cp): chunks of 4 and 2.
GlobalSequences two_sequences() { return {{0, 16, 24}, {0, 16, 32}}; }

TEST(CpLayout, GatheredSequencesAreInPositionOrder) {
  const GroupLayout full = make_group_layout(two_sequences(), 2, {0, 1});
  ASSERT_EQ(full.info.num_sequences(), 2);
  for (int64_t s = 0; s < 2; ++s) {
    const int64_t start = full.info.q_start(s);
    for (int64_t t = 0; t < full.info.q_length(s); ++t) {
      EXPECT_EQ(full.info.q_positions[static_cast<size_t>(start + t)], t) << "sequence " << s << " token " << t;
    }
  }
  // The two reorderings are one permutation and its inverse.
  for (int64_t i = 0; i < full.tokens(); ++i) {
    EXPECT_EQ(full.to_member_major[static_cast<size_t>(full.to_sequence_major[static_cast<size_t>(i)])], i);
  }
  // A rank's own storage keeps its order (positions already increase: chunk r, then chunk 2P-1-r).
  EXPECT_TRUE(make_group_layout(two_sequences(), 2, {0}).identity_order());
  EXPECT_TRUE(make_group_layout(two_sequences(), 2, {1}).identity_order());
}

TEST(CpLayout, SplitQueryRunsKeepsOneChunkPerPart) {
  const GlobalSequences global = two_sequences();
  const GroupLayout own = make_group_layout(global, 2, {0}), full = make_group_layout(global, 2, {0, 1});
  const SequenceInfo pair = pair_sequence_info(own, full);
  const std::vector<SequenceInfo> parts = split_query_runs(pair);
  ASSERT_EQ(parts.size(), 2u);
  // Slots of 16 are cut into chunks of 4: rank 0 holds positions 0..3 and 12..15 of sequence 0, and of
  // sequence 1 (8 real tokens) only 0..3, its chunk 12..15 being padding: one run, so no second part.
  EXPECT_EQ(parts[0].q_length(0), 4);
  EXPECT_EQ(parts[0].q_positions[static_cast<size_t>(parts[0].q_start(0))], 0);
  EXPECT_EQ(parts[1].q_length(0), 4);
  EXPECT_EQ(parts[1].q_positions[static_cast<size_t>(parts[1].q_start(0))], 12);
  EXPECT_EQ(parts[0].q_length(1), 4);
  EXPECT_EQ(parts[0].q_positions[static_cast<size_t>(parts[0].q_start(1))], 0);
  EXPECT_EQ(parts[1].q_length(1), 0);
  for (const SequenceInfo& part : parts) {
    EXPECT_EQ(part.cu_seqlens_kv, pair.cu_seqlens_kv);
    EXPECT_EQ(part.q_storage_tokens(), pair.q_storage_tokens());
  }
  // Every real query is in exactly one part.
  EXPECT_EQ(parts[0].cu_seqlens_q.back() + parts[1].cu_seqlens_q.back(), pair.cu_seqlens_q.back());
  // One run per sequence (the whole gathered sequence as queries): nothing to split.
  EXPECT_EQ(split_query_runs(pair_sequence_info(full, full)).size(), 1u);
}

// Explicit positions (here q = 2i + 3, kv = 2i: gaps and an offset) travel with their tokens: the
// storage order stays the slot order, the query split stays one part per chunk, and a ring step is
// skipped only when the positions hide it.
TEST(CpLayout, ExplicitPositionsTravelWithTheirTokens) {
  GlobalSequences global = two_sequences();
  for (int64_t t = 0; t < 32; ++t) {
    const int64_t slot_index = t % 16;
    global.q_positions.push_back(2 * slot_index + 3);
    global.kv_positions.push_back(2 * slot_index);
  }
  const GroupLayout own = make_group_layout(global, 2, {1}), full = make_group_layout(global, 2, {0, 1});
  for (int64_t i = 0; i < full.tokens(); ++i) {
    const size_t at = static_cast<size_t>(i);
    EXPECT_EQ(full.slot_index[at], full.global_index[at] % 16);
    EXPECT_EQ(full.info.q_positions[at], 2 * full.slot_index[at] + 3) << "token " << i;
    EXPECT_EQ(full.info.kv_positions[at], 2 * full.slot_index[at]) << "token " << i;
  }
  const SequenceInfo pair = pair_sequence_info(own, full);
  EXPECT_EQ(pair.q_positions, own.info.q_positions);
  EXPECT_EQ(pair.kv_positions, full.info.kv_positions);
  // Rank 1 holds chunks 1 and 2 (slot indices 4..11): one run of slot indices, so one part, although
  // no two of its positions are consecutive.
  EXPECT_EQ(split_query_runs(pair, own.slot_index).size(), 1u);
  EXPECT_EQ(split_query_runs(pair).size(), 8u);  // by positions: one part per query of the longest sequence
  // A ring step is skipped by the positions, not the slot indices. Under the diagonal-only window
  // {0, 0}, rank 0 (slot indices 0..3, 12..15) sees none of rank 1's keys (4..11) by slot index, but
  // with q positions shifted by one (with_position_offsets(1, 0)) its query at slot 3 sees key slot 4.
  GlobalSequences shifted = two_sequences();
  for (int64_t t = 0; t < 32; ++t) {
    shifted.q_positions.push_back(t % 16 + 1);
    shifted.kv_positions.push_back(t % 16);
  }
  const AttentionWindow diagonal{0, 0};
  EXPECT_FALSE(
      any_visible(make_group_layout(two_sequences(), 2, {0}), make_group_layout(two_sequences(), 2, {1}), diagonal));
  EXPECT_TRUE(any_visible(make_group_layout(shifted, 2, {0}), make_group_layout(shifted, 2, {1}), diagonal));
}

}  // namespace
}  // namespace cpf::cp
