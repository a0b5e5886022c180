// How the unfused CUDA path cuts a call into chunks (attention/cuda/unfused_chunks.h): host logic,
// so these tests need no GPU. The GPU suite (unfused_test.cpp) checks that the results are right.
#include <gtest/gtest.h>

#include <vector>

#include "attention/cuda/unfused_chunks.h"
#include "support/test_utils.h"

namespace cpf::attention_cuda::unfused {
namespace {

AttentionProblem problem(int64_t s, int64_t h_q, int64_t h_kv, MaskType mask, AttentionWindow window,
                         const std::optional<SequenceInfo>& seq = std::nullopt) {
  const Tensor q = zeros({1, s, h_q, 8}), kv = zeros({1, s, h_kv, 8});
  return check_attention_inputs(q, kv, kv, {.mask = mask, .window = window}, seq, {});
}

std::vector<Chunk> chunks_of(const AttentionProblem& p, size_t bytes_per_score, size_t budget) {
  std::vector<Chunk> out;
  for_each_chunk(p, bytes_per_score, budget, [&](const Chunk& c) { out.push_back(c); });
  return out;
}

TEST(UnfusedChunks, WholeSequenceAndAllHeadsWhenNothingCanBeSkipped) {
  const AttentionProblem p = problem(1100, 8, 2, MaskType::no_mask, {});
  const auto chunks = chunks_of(p, 4, size_t(1) << 30);
  ASSERT_EQ(chunks.size(), 4u);  // one per j of the 4-head groups
  for (int64_t j = 0; j < 4; ++j) {
    const Chunk& c = chunks[static_cast<size_t>(j)];
    EXPECT_EQ(c.j, j);
    EXPECT_EQ(c.g0, 0);
    EXPECT_EQ(c.kv_heads, 2);
    EXPECT_EQ(c.rows, 1100);
    EXPECT_EQ(c.c0, 0);
    EXPECT_EQ(c.cols, 1100);
  }
  EXPECT_EQ(chunk_elements(p, 4, size_t(1) << 30), 2 * 1100 * 1100);
}

TEST(UnfusedChunks, CausalRowBlocksSkipTheKeysAfterTheirLastQuery) {
  const AttentionProblem p = problem(1100, 1, 1, MaskType::causal, {});
  const auto chunks = chunks_of(p, 4, size_t(1) << 30);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].r0, 0);
  EXPECT_EQ(chunks[0].rows, kSkipRowBlock);
  EXPECT_EQ(chunks[0].cols, kSkipRowBlock);
  EXPECT_EQ(chunks[1].r0, kSkipRowBlock);
  EXPECT_EQ(chunks[1].cols, 2 * kSkipRowBlock);
  EXPECT_EQ(chunks[2].rows, 1100 - 2 * kSkipRowBlock);
  EXPECT_EQ(chunks[2].c0, 0);
  EXPECT_EQ(chunks[2].cols, 1100);
}

TEST(UnfusedChunks, SlidingWindowKeepsOnlyTheBand) {
  const AttentionProblem p = problem(1100, 1, 1, MaskType::causal, {100, 0});
  const auto [c0, c1] = visible_columns(p, p.sequences[0], 512, 512);
  EXPECT_EQ(c0, 412);
  EXPECT_EQ(c1, 1024);
}

TEST(UnfusedChunks, RowBlocksThatSeeNoKeyAreSkipped) {
  // Queries at positions 0..15 against keys at 100..115 under a causal mask: nothing is visible.
  const SequenceInfo seq = SequenceInfo::from_lengths({16}, 16).with_position_offsets(0, 100);
  const AttentionProblem p = problem(16, 2, 2, MaskType::causal, {}, seq);
  EXPECT_TRUE(chunks_of(p, 4, size_t(1) << 30).empty());
}

TEST(UnfusedChunks, UnsortedKeyPositionsKeepEveryColumn) {
  const SequenceInfo seq = SequenceInfo::from_lengths({4}, 4).with_positions({0, 1, 2, 3}, {3, 0, 2, 1});
  const AttentionProblem p = problem(4, 1, 1, MaskType::causal, {}, seq);
  const auto [c0, c1] = visible_columns(p, p.sequences[0], 0, 1);
  EXPECT_EQ(c0, 0);
  EXPECT_EQ(c1, 4);
}

TEST(UnfusedChunks, SmallBudgetsSliceRowsAndHeads) {
  const AttentionProblem p = problem(100, 4, 4, MaskType::no_mask, {});
  // 10 rows of 100 scores of 4 bytes: row slices of one head.
  auto chunks = chunks_of(p, 4, 10 * 100 * 4);
  ASSERT_EQ(chunks.size(), 40u);
  EXPECT_EQ(chunks[0].kv_heads, 1);
  EXPECT_EQ(chunks[0].rows, 10);
  // 250 rows: two heads of the whole sequence at a time.
  chunks = chunks_of(p, 4, 250 * 100 * 4);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1].g0, 2);
  EXPECT_EQ(chunks[1].kv_heads, 2);
  EXPECT_EQ(chunks[1].rows, 100);
  // Less than a row still makes progress, one row at a time.
  EXPECT_EQ(chunks_of(p, 4, 1).size(), 400u);
  EXPECT_EQ(chunk_elements(p, 4, 1), 100);
}

}  // namespace
}  // namespace cpf::attention_cuda::unfused
