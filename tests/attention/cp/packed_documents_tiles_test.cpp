// The CP tiles of gpu_cp_bench's packed-documents batch (benchmarks/gpu/cp_bench_thd.h: 85 documents of
// lognormal lengths, 262144 real tokens, 4 ranks), as docs/cp.md ("Packed documents") describes them:
// every ring step of every rank is computed and each tile's SequenceInfo pairs all 85 documents (one
// call, not one per document); all_gather's rank 0 has one query chunk that sees none of the others'
// keys; and a call's longest document makes b x (its rounded length) about 10.6 x the query tokens,
// the size cuDNN gives its (b, h, s) buffers before it trims the queries or keys a tile does not see
// (half of that for the ring's off-diagonal tiles: gpu_cp_bench --thd-plan).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "attention/cp/layout.h"
#include "attention/cp/layout_cache.h"
#include "attention/cp/sharding.h"
#include "attention/cp/work_balance.h"

namespace cpf::cp {
namespace {

constexpr int kRanks = 4;

GlobalSequences benchmark_batch() {
  GlobalSequences g;
  g.cu_seqlens = {0};
  for (int64_t len : packed_document_lengths(kRanks * 65536, 1234)) g.cu_seqlens.push_back(g.cu_seqlens.back() + len);
  g.cu_seqlens_padded = pad_cu_seqlens(g.cu_seqlens, kRanks);
  return g;
}

// b x (the longest real query length rounded up to 128) over the storage's query tokens.
double padded_rows_per_token(const SequenceInfo& info) {
  int64_t longest = 0;
  for (int64_t n = 0; n < info.num_sequences(); ++n) longest = std::max(longest, info.q_length(n));
  const int64_t rounded = (longest + 127) / 128 * 128;
  return static_cast<double>(info.num_sequences() * rounded) / static_cast<double>(info.q_storage_tokens());
}

TEST(PackedDocumentsTiles, TheBatchIsTheBenchmarks) {
  const GlobalSequences g = benchmark_batch();
  EXPECT_EQ(g.num_sequences(), 85);
  EXPECT_EQ(g.cu_seqlens.back(), 262144);
  EXPECT_EQ(g.cu_seqlens_padded.back(), 262416);
  int64_t longest = 0;
  for (int64_t n = 0; n < g.num_sequences(); ++n) longest = std::max(longest, g.cu_seqlens[n + 1] - g.cu_seqlens[n]);
  EXPECT_EQ(longest, 32768);
}

TEST(PackedDocumentsTiles, EveryRingStepIsOneCallOverEveryDocument) {
  const GlobalSequences g = benchmark_batch();
  const auto layouts = cached_rank_layouts(g, kRanks);
  const AttentionWindow causal{-1, 0};
  for (int me = 0; me < kRanks; ++me) {
    for (int step = 0; step < kRanks; ++step) {
      const auto& q = (*layouts)[static_cast<size_t>(me)];
      const auto& kv = (*layouts)[static_cast<size_t>((me - step + kRanks) % kRanks)];
      EXPECT_TRUE(any_visible(q, kv, causal)) << "rank " << me << " step " << step;
      const SequenceInfo pair = pair_sequence_info(q, kv);
      EXPECT_EQ(pair.num_sequences(), 85);
      for (int64_t n = 0; n < pair.num_sequences(); ++n) {
        ASSERT_GT(pair.q_length(n), 0) << "document " << n;
        ASSERT_GT(pair.kv_length(n), 0) << "document " << n;
      }
      // Every tile holds both of the rank's chunks of the 32k documents: 8192 real queries.
      EXPECT_NEAR(padded_rows_per_token(pair), 10.61, 0.01) << "rank " << me << " step " << step;
    }
  }
}

TEST(PackedDocumentsTiles, AllGatherRankZeroFirstChunkSeesNoOtherKey) {
  const GlobalSequences g = benchmark_batch();
  const auto own = cached_group_layout(g, kRanks, {0});
  const auto others = cached_group_layout(g, kRanks, {1, 2, 3});
  const auto parts = split_query_runs(pair_sequence_info(*own, *others), own->slot_index);
  ASSERT_EQ(parts.size(), 2u);  // chunk 0, then chunk 2P - 1
  // Chunk 0 of every document comes before every key the other ranks hold.
  for (int64_t n = 0; n < parts[0].num_sequences(); ++n) {
    const int64_t len = parts[0].q_length(n);
    if (len == 0) continue;
    const int64_t last_q = parts[0].q_positions[static_cast<size_t>(parts[0].q_start(n) + len - 1)];
    const int64_t first_k = others->info.kv_positions[static_cast<size_t>(others->info.q_start(n))];
    EXPECT_LT(last_q, first_k) << "document " << n;
  }
}

TEST(PackedDocumentsTiles, TheWholeBatchCallIsAsPadded) {
  // a2a's call (every rank's tokens, sequence-major) has the one-GPU call's documents and ratio.
  const GlobalSequences g = benchmark_batch();
  const auto whole = cached_group_layout(g, kRanks, {0, 1, 2, 3});
  const SequenceInfo info = pair_sequence_info(*whole, *whole);
  EXPECT_EQ(info.num_sequences(), 85);
  EXPECT_NEAR(padded_rows_per_token(info), 10.61, 0.01);
  EXPECT_NEAR(padded_rows_per_token(SequenceInfo::from_cu_seqlens(g.cu_seqlens, g.cu_seqlens_padded)), 10.61, 0.01);
}

}  // namespace
}  // namespace cpf::cp
