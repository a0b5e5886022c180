#include <gtest/gtest.h>

#include "models/data/cp_shard.h"
#include "models/data/data_loader.h"
#include "support/test_utils.h"

namespace cpf::models::data {
namespace {

DataOptions cp_options(int64_t cp_size, const std::string& layout = "thd") {
  DataOptions o;
  o.task = "addition";  // units of 6..31 tokens: odd, even and cut at seq_len
  o.min_len = 1;
  o.max_len = 9;
  o.num_examples = 64;
  o.layout = layout;
  o.seq_len = 16;
  o.batch_size = 3;  // thd: T = 48
  o.pad_multiple = 2 * cp_size;
  return o;
}

void expect_same_values(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.to_vector<int64_t>(), b.to_vector<int64_t>());
}

TEST(CpShard, ThdShardsFollowTheDualChunkLayoutAndUnshardToTheGlobalBatch) {
  for (int64_t cp : {2, 3, 4}) {
    DataLoader loader(cp_options(cp));
    for (int step = 0; step < 5; ++step) {
      const Batch batch = loader.next();
      std::vector<LocalBatch> shards;
      int64_t valid = 0;
      for (int64_t r = 0; r < cp; ++r) {
        shards.push_back(shard_for_rank(batch, cp, r));
        const LocalBatch& local = shards.back();
        EXPECT_EQ(local.tokens.shape(), (Shape{48 / cp}));
        // Each local token is the global token at the index the CP shard names.
        const auto global_tokens = batch.tokens.to_vector<int64_t>();
        const auto local_tokens = local.tokens.to_vector<int64_t>();
        ASSERT_EQ(local.thd.local_tokens(), 48 / cp);
        for (int64_t i = 0; i < local.thd.local_tokens(); ++i) {
          EXPECT_EQ(local_tokens[i], global_tokens[local.thd.global_index[i]]);
        }
        // The loader's positions are the shard's positions inside each sequence.
        EXPECT_EQ(local.positions.to_vector<int64_t>(), local.thd.position);
        EXPECT_EQ(local.thd.cu_seqlens, batch.cu_seqlens);
        EXPECT_EQ(local.global_num_valid_labels, batch.num_valid_labels);
        // Padding (valid = 0) never has a label.
        const auto labels = local.labels.to_vector<int64_t>();
        for (int64_t i = 0; i < local.thd.local_tokens(); ++i) {
          if (!local.thd.valid[i]) EXPECT_EQ(labels[i], kIgnoreLabel);
        }
        valid += local.num_valid_labels;
      }
      EXPECT_EQ(valid, batch.num_valid_labels);
      const Batch back = unshard_batch(shards);
      expect_same_values(back.tokens, batch.tokens);
      expect_same_values(back.labels, batch.labels);
      expect_same_values(back.positions, batch.positions);
      EXPECT_EQ(back.cu_seqlens, batch.cu_seqlens);
      EXPECT_EQ(back.cu_seqlens_padded, batch.cu_seqlens_padded);
      EXPECT_EQ(back.num_valid_labels, batch.num_valid_labels);
    }
  }
}

TEST(CpShard, BshdShardsSplitTheSequenceDimension) {
  DataLoader loader(cp_options(2, "bshd"));
  const Batch batch = loader.next();
  ASSERT_EQ(batch.tokens.shape(), (Shape{3, 16}));
  std::vector<LocalBatch> shards{shard_for_rank(batch, 2, 0), shard_for_rank(batch, 2, 1)};
  EXPECT_EQ(shards[0].tokens.shape(), (Shape{3, 8}));
  // Rank 0 holds columns 0..3 and 12..15 of every row (chunks 0 and 3 of 4).
  EXPECT_EQ(shards[0].positions.to_vector<int64_t>()[4], 12);
  EXPECT_EQ(shards[1].positions.to_vector<int64_t>()[0], 4);
  EXPECT_EQ(shards[0].num_valid_labels + shards[1].num_valid_labels, batch.num_valid_labels);
  const Batch back = unshard_batch(shards);
  expect_same_values(back.tokens, batch.tokens);
  expect_same_values(back.labels, batch.labels);
  expect_same_values(back.positions, batch.positions);
}

TEST(CpShard, SingleRankIsTheIdentityEvenWithOddSlots) {
  DataOptions o = cp_options(1);
  o.pad_multiple = 1;  // odd slot lengths
  DataLoader loader(o);
  auto has_odd_slot = [](const Batch& b) {
    for (int64_t s = 0; s < b.num_sequences(); ++s) {
      if ((b.cu_seqlens_padded[s + 1] - b.cu_seqlens_padded[s]) % 2 != 0) return true;
    }
    return false;
  };
  Batch batch = loader.next();
  for (int tries = 0; tries < 20 && !has_odd_slot(batch); ++tries) batch = loader.next();
  ASSERT_TRUE(has_odd_slot(batch));
  const LocalBatch local = shard_for_rank(batch, 1, 0);
  expect_same_values(local.tokens, batch.tokens);
  expect_same_values(local.labels, batch.labels);
  EXPECT_EQ(local.positions.to_vector<int64_t>(), local.thd.position);
  std::vector<int64_t> identity(48);
  for (int64_t i = 0; i < 48; ++i) identity[i] = i;
  EXPECT_EQ(local.thd.global_index, identity);
  EXPECT_EQ(local.thd.cu_seqlens_padded_local, batch.cu_seqlens_padded);
  EXPECT_EQ(local.num_valid_labels, batch.num_valid_labels);
  // Even slots go through cp::thd_shard and give the same identity.
  DataLoader even(cp_options(1));
  const Batch even_batch = even.next();
  const LocalBatch even_local = shard_for_rank(even_batch, 1, 0);
  expect_same_values(even_local.tokens, even_batch.tokens);
  EXPECT_EQ(even_local.thd.global_index, identity);
  expect_same_values(unshard_batch({even_local}).tokens, even_batch.tokens);
}

TEST(CpShard, RejectsPaddingThatDoesNotSuitTheGroupAndBadRanks) {
  DataLoader thd(cp_options(1));  // slots are multiples of 2, not always of 4
  Batch batch = thd.next();
  auto all_slots_fit = [](const Batch& b) {
    for (int64_t s = 0; s < b.num_sequences(); ++s) {
      if ((b.cu_seqlens_padded[s + 1] - b.cu_seqlens_padded[s]) % 4 != 0) return false;
    }
    return true;
  };
  for (int tries = 0; tries < 20 && all_slots_fit(batch); ++tries) batch = thd.next();
  ASSERT_FALSE(all_slots_fit(batch));
  EXPECT_CPF_ERROR(shard_for_rank(batch, 2, 0),
                   "not a multiple of 2*cp_size=4; the batch was packed with "
                   "pad_multiple=2, set pad_multiple to a multiple of 4");
  EXPECT_CPF_ERROR(shard_for_rank(batch, 0, 0), "shard_for_rank: cp_size=0 must be at least 1");
  EXPECT_CPF_ERROR(shard_for_rank(batch, 2, 2), "shard_for_rank: cp_rank=2 is outside the CP group of size 2");
  EXPECT_CPF_ERROR(shard_for_rank(Batch{}, 1, 0), "shard_for_rank: the batch has no tensors");
  DataOptions o = cp_options(1, "bshd");
  o.seq_len = 18;
  DataLoader bshd(o);
  EXPECT_CPF_ERROR(shard_for_rank(bshd.next(), 2, 1), "seq_len=18 is not a multiple of 2*cp_size=4");
  const LocalBatch r0 = shard_for_rank(batch, 1, 0);
  EXPECT_CPF_ERROR(unshard_batch({r0, r0}), "unshard_batch: shard 0 is rank 0 of 1, expected rank 0 of 2");
  EXPECT_CPF_ERROR(unshard_batch({}), "unshard_batch: no shards given");
}

}  // namespace
}  // namespace cpf::models::data
