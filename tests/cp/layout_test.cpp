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

}  // namespace
}  // namespace cpf::cp
