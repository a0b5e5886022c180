// The RoPE positions cache (attention/nn/rope_positions_cache.h): a repeated request is served the
// same table, any change of what the table depends on builds a new one with its own correct contents,
// and the module results do not change with the cache.
#include "attention/nn/rope_positions_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "attention/nn/attention_layout.h"
#include "framework/core/error.h"

namespace cpf::nn {
namespace {

std::vector<int64_t> values(const Tensor& t) { return t.to_vector<int64_t>(); }

// Storage identity: a hit hands back the very table it cached.
bool same_table(const Tensor& a, const Tensor& b) { return a.raw_data() == b.raw_data(); }

TEST(RopePositionsCache, RepeatedRequestHitsAndMatchesTheUncachedTable) {
  const Tensor x = zeros({12, 2, 4});  // (T, H, D) thd
  const SequenceInfo seq = SequenceInfo::from_lengths({5, 7});
  const auto before = rope_positions_cache_stats();
  const Tensor first = cached_rope_positions(x, QkvFormat::thd, seq, false);
  const Tensor second = cached_rope_positions(x, QkvFormat::thd, seq, false);
  const auto after = rope_positions_cache_stats();
  EXPECT_EQ(after.builds - before.builds, 1u);
  EXPECT_EQ(after.hits - before.hits, 1u);
  EXPECT_TRUE(same_table(first, second));
  EXPECT_EQ(values(second), values(rope_positions(x, QkvFormat::thd, seq, false)));
  EXPECT_EQ(values(second), (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6}));
}

TEST(RopePositionsCache, DifferentSequenceLayoutsInARowGetTheirOwnTables) {
  const Tensor x = zeros({12, 2, 4});
  const SequenceInfo a = SequenceInfo::from_lengths({5, 7});
  const SequenceInfo b = SequenceInfo::from_lengths({7, 5});
  SequenceInfo shifted = a.with_position_offsets(3, 3);  // explicit positions, same slots as a
  for (int round = 0; round < 2; ++round) {              // the second round hits every entry
    EXPECT_EQ(values(cached_rope_positions(x, QkvFormat::thd, a, false)),
              values(rope_positions(x, QkvFormat::thd, a, false)));
    EXPECT_EQ(values(cached_rope_positions(x, QkvFormat::thd, b, false)),
              values(rope_positions(x, QkvFormat::thd, b, false)));
    EXPECT_EQ(values(cached_rope_positions(x, QkvFormat::thd, shifted, false)),
              values(rope_positions(x, QkvFormat::thd, shifted, false)));
  }
  EXPECT_NE(values(cached_rope_positions(x, QkvFormat::thd, a, false)),
            values(cached_rope_positions(x, QkvFormat::thd, b, false)));
  EXPECT_NE(values(cached_rope_positions(x, QkvFormat::thd, a, false)),
            values(cached_rope_positions(x, QkvFormat::thd, shifted, false)));
}

TEST(RopePositionsCache, QAndKvSidesAreKeyedApart) {
  const Tensor x = zeros({8, 1, 4});
  // q: one sequence of 8; kv: the same slot, but explicit positions 10.. (a CP-style offset).
  SequenceInfo seq = SequenceInfo::from_lengths({8});
  seq.kv_positions = {10, 11, 12, 13, 14, 15, 16, 17};
  EXPECT_FALSE(same_rope_positions(seq));
  const Tensor q = cached_rope_positions(x, QkvFormat::thd, seq, false);
  const Tensor kv = cached_rope_positions(x, QkvFormat::thd, seq, true);
  EXPECT_EQ(values(q), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(values(kv), seq.kv_positions);
}

TEST(RopePositionsCache, ShapesAndCpRanksAreKeyedApart) {
  // bshd (B, T, H, D) without a SequenceInfo: 0..T-1 per row; the batch and length are in the key.
  EXPECT_EQ(values(cached_rope_positions(zeros({1, 4, 2, 4}), QkvFormat::bshd, std::nullopt, false)),
            (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(values(cached_rope_positions(zeros({2, 3, 2, 4}), QkvFormat::bshd, std::nullopt, false)),
            (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  // The heads and dims are not: the same tokens with other heads share the table.
  const Tensor one = cached_rope_positions(zeros({1, 4, 2, 4}), QkvFormat::bshd, std::nullopt, false);
  const Tensor other = cached_rope_positions(zeros({1, 4, 6, 8}), QkvFormat::bshd, std::nullopt, false);
  EXPECT_TRUE(same_table(one, other));
  // CP = 2 over 8 global tokens (chunks of 2): rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  const Tensor local = zeros({1, 4, 2, 4});
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(values(cached_rope_positions(local, QkvFormat::bshd, std::nullopt, false, 2, 0)),
              (std::vector<int64_t>{0, 1, 6, 7}));
    EXPECT_EQ(values(cached_rope_positions(local, QkvFormat::bshd, std::nullopt, false, 2, 1)),
              (std::vector<int64_t>{2, 3, 4, 5}));
  }
  // cp = 1 and no CP at all are the same request.
  EXPECT_EQ(values(cached_rope_positions(local, QkvFormat::bshd, std::nullopt, false, 1, 0)),
            (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(RopePositionsCache, CpThdMatchesTheUncachedShardPositions) {
  // Two sequences of 8 (padded to 8), CP = 2: each rank holds 2 chunks of 2 tokens per sequence.
  const SequenceInfo seq = SequenceInfo::from_lengths({8, 8});
  const Tensor local = zeros({8, 1, 4});
  for (int64_t rank = 0; rank < 2; ++rank) {
    const std::vector<int64_t> expected = values(cp_rope_positions(local, QkvFormat::thd, seq, false, 2, rank));
    EXPECT_EQ(values(cached_rope_positions(local, QkvFormat::thd, seq, false, 2, rank)), expected);
    EXPECT_EQ(values(cached_rope_positions(local, QkvFormat::thd, seq, false, 2, rank)), expected);
  }
  EXPECT_NE(values(cached_rope_positions(local, QkvFormat::thd, seq, false, 2, 0)),
            values(cached_rope_positions(local, QkvFormat::thd, seq, false, 2, 1)));
}

TEST(RopePositionsCache, EvictsTheLeastRecentlyUsedAndRebuildsIt) {
  const auto table = [](int64_t tokens) {
    return cached_rope_positions(zeros({1, tokens, 1, 2}), QkvFormat::bshd, std::nullopt, false);
  };
  const Tensor first = table(100);
  for (int64_t i = 0; i < static_cast<int64_t>(kRopePositionsCacheEntries); ++i) table(200 + i);
  const auto before = rope_positions_cache_stats();
  const Tensor again = table(100);  // evicted: built anew, same contents
  EXPECT_EQ(rope_positions_cache_stats().builds - before.builds, 1u);
  EXPECT_FALSE(same_table(first, again));
  EXPECT_EQ(values(first), values(again));
}

TEST(RopePositionsCache, SameRopePositionsDecidesOnTheArrays) {
  const SequenceInfo self = SequenceInfo::from_lengths({3, 5});
  EXPECT_TRUE(same_rope_positions(self));
  EXPECT_FALSE(same_rope_positions(SequenceInfo::from_lengths({3, 5}, {4, 4})));
  EXPECT_TRUE(same_rope_positions(self.with_position_offsets(2, 2)));
  EXPECT_FALSE(same_rope_positions(self.with_position_offsets(2, 3)));
  // One side explicit with the implicit values of the other: the same positions.
  SequenceInfo half = self;
  half.kv_positions = self.resolved_kv_positions();
  EXPECT_TRUE(same_rope_positions(half));
  half.kv_positions[0] = 9;
  EXPECT_FALSE(same_rope_positions(half));
}

TEST(RopePositionsCache, RejectsBadRequestsWithTheirValues) {
  EXPECT_THAT([] { cached_rope_positions(Tensor(), QkvFormat::thd, std::nullopt, false); },
              testing::ThrowsMessage<Error>(testing::HasSubstr("rope positions: x is undefined")));
  EXPECT_THAT(
      [] {
        cached_rope_positions(zeros({1, 4, 1, 2}), QkvFormat::bshd, std::nullopt, false, 2, 2);
      },
      testing::ThrowsMessage<Error>(testing::HasSubstr("cp_rank 2 is not a rank of a CP group of size 2")));
  // thd under CP needs the global sequences: the build's error comes through, and nothing is cached.
  EXPECT_THAT(
      [] {
        cached_rope_positions(zeros({4, 1, 2}), QkvFormat::thd, std::nullopt, false, 2, 0);
      },
      testing::ThrowsMessage<Error>(testing::HasSubstr("needs the global sequence info")));
}

}  // namespace
}  // namespace cpf::nn
