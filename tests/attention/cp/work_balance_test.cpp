// Per-rank attention work from the sharding (work_balance.h) and the benchmark's document lengths.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "attention/cp/sharding.h"
#include "attention/cp/work_balance.h"

namespace cpf::cp {
namespace {

// One document of 8 slots over 2 ranks (chunks of 2): rank 0 holds positions 0 1 6 7, rank 1 2 3 4 5.
TEST(WorkBalance, WholeDocumentIsBalancedByTheDualChunks) {
  const auto p2p = causal_pairs_per_rank({0, 8}, {0, 8}, CommType::p2p, 2);
  EXPECT_EQ(p2p, (std::vector<double>{1 + 2 + 7 + 8, 3 + 4 + 5 + 6}));
  EXPECT_DOUBLE_EQ(work_imbalance(p2p), 1.0);
}

// Real length 5 in a slot of 8: rank 0's second chunk (6, 7) is padding, rank 1 keeps 2 3 4.
TEST(WorkBalance, PaddingLeavesTheLastChunksShort) {
  for (CommType comm : {CommType::p2p, CommType::all_gather}) {
    const auto work = causal_pairs_per_rank({0, 5}, {0, 8}, comm, 2);
    EXPECT_EQ(work, (std::vector<double>{1 + 2, 3 + 4 + 5}));
    EXPECT_DOUBLE_EQ(work_imbalance(work), 12.0 / 7.5);
  }
  // Ulysses splits heads, not tokens: every rank gets half of all 15 pairs.
  EXPECT_EQ(causal_pairs_per_rank({0, 5}, {0, 8}, CommType::a2a, 2), (std::vector<double>{7.5, 7.5}));
}

// a2a+p2p 2 x 2: a rank does half of its a2a group's queries' pairs. One document of 16, chunks of 2:
// ranks 0..3 hold {0,7} {1,6} {2,5} {3,4}; group {0,1} = chunks 0 1 6 7, group {2,3} = 2 3 4 5.
TEST(WorkBalance, HierarchicalSharesTheGroupWork) {
  const auto own = causal_pairs_per_rank({0, 11}, {0, 16}, CommType::p2p, 4);
  const auto work = causal_pairs_per_rank({0, 11}, {0, 16}, CommType::a2a_p2p, 4, 2);
  ASSERT_EQ(work.size(), 4u);
  EXPECT_DOUBLE_EQ(work[0], (own[0] + own[1]) / 2);
  EXPECT_DOUBLE_EQ(work[1], work[0]);
  EXPECT_DOUBLE_EQ(work[2], (own[2] + own[3]) / 2);
  EXPECT_DOUBLE_EQ(std::accumulate(work.begin(), work.end(), 0.0), 11.0 * 12 / 2);  // all pairs, once
}

TEST(WorkBalance, BadInputsAreRefusedByName) {
  try {
    causal_pairs_per_rank({0, 11}, {0, 16}, CommType::a2a_p2p, 4, 3);
    FAIL() << "a2a size 3 of cp 4 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("a2a_size=3 does not divide cp_size=4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(causal_pairs_per_rank({0, 5}, {0, 6}, CommType::p2p, 2), std::exception);  // slot not a multiple of 4
  try {
    work_imbalance({});
    FAIL() << "empty accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("work_imbalance: no ranks"), std::string::npos) << e.what();
  }
  try {
    packed_document_lengths(100, 1, 200, 100);
    FAIL() << "min above max accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("min_len=200 max_len=100"), std::string::npos) << e.what();
  }
}

TEST(PackedDocuments, LengthsFillTheBudgetWithinTheClip) {
  const auto lengths = packed_document_lengths(131072, 42);
  EXPECT_EQ(std::accumulate(lengths.begin(), lengths.end(), int64_t{0}), 131072);
  for (size_t i = 0; i + 1 < lengths.size(); ++i) {
    EXPECT_GE(lengths[i], 128);
    EXPECT_LE(lengths[i], 32768);
  }
  EXPECT_GT(lengths.size(), 10u);                           // many documents, not one long one
  EXPECT_EQ(lengths, packed_document_lengths(131072, 42));  // fixed seed, same batch
  EXPECT_NE(lengths, packed_document_lengths(131072, 43));
}

// The benchmark's batch: padding to multiples of 2P shifts a little work, and Ulysses none.
TEST(PackedDocuments, BenchmarkBatchImbalanceIsSmall) {
  const auto lengths = packed_document_lengths(4 * 65536, 1234);
  std::vector<int64_t> cu{0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  const auto padded = pad_cu_seqlens(cu, 4);
  EXPECT_LT(work_imbalance(causal_pairs_per_rank(cu, padded, CommType::p2p, 4)), 1.05);
  EXPECT_DOUBLE_EQ(work_imbalance(causal_pairs_per_rank(cu, padded, CommType::a2a, 4)), 1.0);
}

}  // namespace
}  // namespace cpf::cp
