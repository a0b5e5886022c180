#include <gtest/gtest.h>

#include "attention/cp/sharding.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf::cp {
namespace {

TEST(DualChunk, PositionsMatchTheLoadBalancedLayout) {
  EXPECT_EQ(dual_chunk_positions(8, 2, 0), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(dual_chunk_positions(8, 2, 1), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(dual_chunk_positions(8, 4, 3), (std::vector<int64_t>{3, 4}));
  // Every position is held by exactly one rank.
  for (int64_t p : {1, 2, 3, 4}) {
    std::vector<int> seen(24, 0);
    for (int64_t r = 0; r < p; ++r) {
      for (int64_t pos : dual_chunk_positions(24, p, r)) seen[pos] += 1;
    }
    for (int count : seen) EXPECT_EQ(count, 1);
  }
}

TEST(DualChunk, RejectsIndivisibleLengthsAndBadRanks) {
  EXPECT_CPF_ERROR(dual_chunk_positions(10, 2, 0), "sequence length 10 is not divisible by 2*cp_size=4");
  EXPECT_CPF_ERROR(dual_chunk_positions(8, 2, 2), "rank=2 is outside the CP group of size 2");
  EXPECT_CPF_ERROR(dual_chunk_positions(8, 0, 0), "cp_size=0 must be at least 1");
}

TEST(DualChunk, ShardAndUnshardRoundTrip) {
  Tensor t = testing::random_tensor({2, 16, 3}, DType::f32, 5);  // (B, S, D)
  for (int64_t p : {1, 2, 4}) {
    std::vector<Tensor> shards;
    for (int64_t r = 0; r < p; ++r) shards.push_back(shard_sequence(t, 1, p, r));
    EXPECT_EQ(shards[0].shape(), (Shape{2, 16 / p, 3}));
    EXPECT_TRUE(testing::all_close(unshard_sequence(shards, 1), t, 0, 0));
  }
  // Rank 1 of P=2 holds chunks 1 and 2 (tokens 4..11).
  Tensor s1 = shard_sequence(t, 1, 2, 1);
  EXPECT_TRUE(testing::all_close(s1, raw::contiguous(raw::narrow(t, 1, 4, 8)), 0, 0));
}

TEST(DualChunk, ChunkReorderMapsAreInverse) {
  const int64_t p = 3;
  Tensor seq = arange(12, {.dtype = DType::f32});  // sequence order, chunk = 2
  std::vector<Tensor> shards;
  for (int64_t r = 0; r < p; ++r) shards.push_back(shard_sequence(seq, 0, p, r));
  // What an all-gather returns: shards concatenated in rank order.
  Tensor gathered = empty({12});
  for (int64_t r = 0; r < p; ++r) raw::copy_(raw::narrow(gathered, 0, 4 * r, 4), shards[r]);
  EXPECT_TRUE(testing::all_close(rank_order_to_sequence_order(gathered, 0, p), seq, 0, 0));
  EXPECT_TRUE(testing::all_close(sequence_order_to_rank_order(seq, 0, p), gathered, 0, 0));
}

TEST(ThdShard, ClampFormulaAndIndicesFollowTheSpecExample) {
  // cu_seqlens [0,8,16,24,40], P = 4: rank 0 takes {0,7} of each 8-token sequence, {0,1,14,15} of the 16.
  const std::vector<int64_t> cu{0, 8, 16, 24, 40};
  ThdShard s = thd_shard(cu, cu, 4, 0);
  EXPECT_EQ(s.global_index, (std::vector<int64_t>{0, 7, 8, 15, 16, 23, 24, 25, 38, 39}));
  EXPECT_EQ(s.cu_seqlens_padded_local, (std::vector<int64_t>{0, 2, 4, 6, 10}));
  EXPECT_EQ(s.position, (std::vector<int64_t>{0, 7, 0, 7, 0, 7, 0, 1, 14, 15}));
}

TEST(ThdShard, RealTokensPerHalfUseTheClampFormula) {
  // One sequence of real length 7 padded to 8, P = 2 (four chunks of 2): rank 0 holds chunks 0 and 3.
  const std::vector<int64_t> cu{0, 7};
  const auto padded = pad_cu_seqlens(cu, 2);
  EXPECT_EQ(padded, (std::vector<int64_t>{0, 8}));
  ThdShard r0 = thd_shard(cu, padded, 2, 0);  // positions {0,1} and {6,7}
  EXPECT_EQ(r0.real_first_half, (std::vector<int64_t>{2}));
  EXPECT_EQ(r0.real_second_half, (std::vector<int64_t>{1}));  // position 6 real, 7 padding
  EXPECT_EQ(r0.valid, (std::vector<uint8_t>{1, 1, 1, 0}));
  // A short sequence leaves whole halves as padding.
  ThdShard shortseq = thd_shard({0, 1}, {0, 8}, 2, 1);
  EXPECT_EQ(shortseq.real_first_half, (std::vector<int64_t>{0}));
  EXPECT_EQ(shortseq.real_second_half, (std::vector<int64_t>{0}));
}

TEST(ThdShard, TokenShardRoundTripWithPaddingBetweenSequences) {
  const std::vector<int64_t> cu{0, 5, 5, 13};
  const auto padded = pad_cu_seqlens(cu, 2);  // lengths 5, 0, 8 -> 8, 0, 8
  EXPECT_EQ(padded, (std::vector<int64_t>{0, 8, 8, 16}));
  Tensor t = testing::random_tensor({16, 2, 3}, DType::f64, 9);
  std::vector<Tensor> shards;
  std::vector<ThdShard> infos;
  for (int64_t r = 0; r < 2; ++r) {
    infos.push_back(thd_shard(cu, padded, 2, r));
    shards.push_back(shard_tokens(t, infos.back()));
  }
  EXPECT_TRUE(testing::all_close(unshard_tokens(shards, infos), t, 0, 0));
}

TEST(ThdShard, RejectsInconsistentSequenceMetadata) {
  EXPECT_CPF_ERROR(thd_shard({0, 7}, {0, 7}, 2, 0), "padded length 7 of sequence 0 is not divisible by 2*cp_size=4");
  EXPECT_CPF_ERROR(thd_shard({0, 9}, {0, 8}, 2, 0), "has real length 9 and padded length 8");
  EXPECT_CPF_ERROR(thd_shard({0, 4, 8}, {0, 8}, 2, 0), "must have the same, non-zero number of entries");
  EXPECT_CPF_ERROR(thd_shard({1, 4}, {0, 8}, 2, 0), "must start at 0");
  ThdShard s = thd_shard({0, 4}, {0, 8}, 2, 0);
  EXPECT_CPF_ERROR(shard_tokens(zeros({6, 2}), s), "does not hold the 8 tokens");
}

}  // namespace
}  // namespace cpf::cp
