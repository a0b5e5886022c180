// SequenceInfo::from_segment_ids: derived lengths and offsets under causal, sliding-window and
// padding masks, with and without extra leading batch dims; attention on the derived info equals
// attention with a mask built straight from the ids; bad shapes and ids rejected.
#include <gtest/gtest.h>

#include "attention/dot_product_attention.h"
#include "tests/attention/attention_support.h"

namespace cpf {
namespace {

using V = std::vector<int64_t>;

Tensor ids(const V& values, const Shape& shape) { return from_vector(values, shape); }

TEST(SegmentIds, ThdCausalSelfAttentionKeepsEveryRealToken) {
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal};
  const SequenceInfo info = SequenceInfo::from_segment_ids(spec, ids({1, 1, 1, 2, 2, 0, 3, 3, 3, 3}, {10}),
                                                           ids({0, 1, 2, 0, 1, 0, 0, 1, 2, 3}, {10}));
  EXPECT_EQ(info.cu_seqlens_q, (V{0, 3, 5, 9}));
  EXPECT_EQ(info.cu_seqlens_q_padded, (V{0, 3, 6, 10}));
  EXPECT_EQ(info.cu_seqlens_kv, info.cu_seqlens_q);
  EXPECT_EQ(info.cu_seqlens_kv_padded, info.cu_seqlens_q_padded);
  EXPECT_EQ(info.max_seqlen_q, 4);
  EXPECT_EQ(info.q_positions, (V{0, 1, 2, 0, 1, 0, 0, 1, 2, 3}));
}

TEST(SegmentIds, CausalDropsQueriesBeforeAndKeysAfterTheOtherSide) {
  // kv positions run one ahead of q: the first query sees no key, the last key is seen by no query.
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal};
  const SequenceInfo info = SequenceInfo::from_segment_ids(spec, ids({1, 1, 1}, {3}), ids({0, 1, 2}, {3}),
                                                           ids({1, 1, 1}, {3}), ids({1, 2, 3}, {3}));
  EXPECT_EQ(info.cu_seqlens_q, (V{0, 2}));
  EXPECT_EQ(info.cu_seqlens_q_padded, (V{1, 3}));
  EXPECT_EQ(info.cu_seqlens_kv, (V{0, 2}));
  EXPECT_EQ(info.cu_seqlens_kv_padded, (V{0, 3}));
}

TEST(SegmentIds, SlidingWindowDropsKeysOutOfReach) {
  // Queries at 10..13 with a window of 8 keys back: keys at 0 and 1 are never seen.
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::causal, .window = {8, 0}};
  const SequenceInfo info = SequenceInfo::from_segment_ids(spec, ids({1, 1, 1, 1}, {4}), ids({10, 11, 12, 13}, {4}),
                                                           ids({1, 1, 1, 1, 1, 1}, {6}), ids({0, 1, 2, 3, 4, 5}, {6}));
  EXPECT_EQ(info.cu_seqlens_q, (V{0, 4}));
  EXPECT_EQ(info.cu_seqlens_kv, (V{0, 4}));
  EXPECT_EQ(info.cu_seqlens_kv_padded, (V{2, 6}));
  EXPECT_EQ(info.max_seqlen_kv, 4);
}

TEST(SegmentIds, PaddingMaskDropsSegmentsWithoutKeys) {
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding};
  const SequenceInfo info = SequenceInfo::from_segment_ids(spec, ids({1, 1, 2, 2}, {4}), ids({0, 1, 0, 1}, {4}),
                                                           ids({1, 1, 1, 0}, {4}), ids({0, 1, 2, 0}, {4}));
  EXPECT_EQ(info.num_sequences(), 1);
  EXPECT_EQ(info.cu_seqlens_q, (V{0, 2}));
  EXPECT_EQ(info.cu_seqlens_kv, (V{0, 3}));
  EXPECT_EQ(info.cu_seqlens_q_padded, (V{0, 4}));
}

TEST(SegmentIds, BshdRowsWithPaddingAndWholeRows) {
  const Tensor pos = ids({0, 1, 2, 3, 4, 0, 1, 2, 3, 4}, {2, 5});
  const Tensor segs = ids({1, 1, 1, 0, 0, 1, 1, 1, 1, 1}, {2, 5});
  const SequenceInfo padded =
      SequenceInfo::from_segment_ids({.qkv_format = QkvFormat::bshd, .mask = MaskType::padding_causal}, segs, pos);
  EXPECT_EQ(padded.cu_seqlens_q, (V{0, 3, 8}));
  EXPECT_EQ(padded.cu_seqlens_q_padded, (V{0, 5, 10}));
  const SequenceInfo whole = SequenceInfo::from_segment_ids({.qkv_format = QkvFormat::sbhd, .mask = MaskType::causal},
                                                            ids(V(10, 1), {2, 5}), pos);
  EXPECT_EQ(whole.cu_seqlens_q, (V{0, 5, 10}));
  EXPECT_EQ(whole.cu_seqlens_kv_padded, (V{0, 5, 10}));
}

TEST(SegmentIds, ExtraLeadingBatchDimsBroadcastPositions) {
  // ids (2, 2, 4) over positions (2, 4): four rows, positions repeated for each leading index.
  const Tensor pos = ids({0, 1, 2, 3, 0, 1, 2, 3}, {2, 4});
  const Tensor segs = ids({1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0}, {2, 2, 4});
  const SequenceInfo info =
      SequenceInfo::from_segment_ids({.qkv_format = QkvFormat::bshd, .mask = MaskType::padding}, segs, pos);
  EXPECT_EQ(info.cu_seqlens_q, (V{0, 2, 5, 9, 10}));
  EXPECT_EQ(info.cu_seqlens_q_padded, (V{0, 4, 8, 12, 16}));
  EXPECT_EQ(info.q_positions.size(), 16u);
  // thd: ids (3, 6) over positions (6): three packed rows of 6 tokens, 18 storage tokens.
  const Tensor tpos = ids({0, 1, 2, 0, 1, 2}, {6});
  const Tensor tsegs = ids({1, 1, 1, 2, 2, 2, 1, 1, 0, 2, 2, 2, 0, 0, 0, 3, 3, 3}, {3, 6});
  const SequenceInfo packed =
      SequenceInfo::from_segment_ids({.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal}, tsegs, tpos);
  EXPECT_EQ(packed.cu_seqlens_q, (V{0, 3, 6, 8, 11, 14}));
  EXPECT_EQ(packed.cu_seqlens_q_padded, (V{0, 3, 6, 9, 15, 18}));
  EXPECT_EQ(packed.q_positions[15], 0);
}

TEST(SegmentIds, AttentionOnDerivedInfoEqualsTheSegmentMask) {
  // Oracle mask straight from ids and positions: same nonzero id and inside the causal window.
  const V seg{1, 1, 1, 2, 2, 2, 2, 0, 3, 3};
  const V pos{3, 4, 5, 0, 1, 2, 3, 0, 0, 1};
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal, .window = {2, 0}};
  const SequenceInfo info = SequenceInfo::from_segment_ids(spec, ids(seg, {10}), ids(pos, {10}));
  Tensor mask = zeros({1, 1, 10, 10}, {.dtype = DType::boolean});
  for (int i = 0; i < 10; ++i) {
    for (int j = 0; j < 10; ++j) {
      mask.data<bool>()[i * 10 + j] = seg[i] != 0 && seg[i] == seg[j] && pos[j] <= pos[i] && pos[j] >= pos[i] - 2;
    }
  }
  const Tensor q = testing::random_tensor({10, 2, 4}, DType::f64, 1),
               k = testing::random_tensor({10, 1, 4}, DType::f64, 2);
  const Tensor v = testing::random_tensor({10, 1, 4}, DType::f64, 3);
  const AttentionOutput got = dot_product_attention(q, k, v, spec, info, {.block_q = 3, .block_kv = 2});
  const testing::NaiveAttention want = testing::naive_attention_masked(q, k, v, spec, mask);
  EXPECT_TRUE(testing::all_close(got.out, want.out, 1e-12, 1e-12));
  EXPECT_TRUE(testing::all_close(got.lse, want.lse, 1e-12, 1e-12));
}

TEST(SegmentIds, RejectsInconsistentShapesAndIds) {
  const AttentionSpec thd{.qkv_format = QkvFormat::thd, .mask = MaskType::padding};
  EXPECT_CPF_ERROR(SequenceInfo::from_segment_ids(thd, ids(V(16, 1), {2, 8}), ids(V(7, 0), {7})),
                   "q segment_ids [2,8] and segment_pos [7] do not match");
  EXPECT_CPF_ERROR(SequenceInfo::from_segment_ids(thd, ids(V(4, 1), {4}), ids(V(8, 0), {2, 4})),
                   "q segment_ids [4] and segment_pos [2,4] do not match: segment_ids must have segment_pos's shape");
  EXPECT_CPF_ERROR(
      SequenceInfo::from_segment_ids(thd, ids(V(4, 1), {4}), ids(V(4, 0), {4}), ids(V(4, 1), {4}), ids(V(5, 0), {5})),
      "kv segment_ids [4] and segment_pos [5] do not match");
  EXPECT_CPF_ERROR(SequenceInfo::from_segment_ids(thd, full({4}, 1.0), ids(V(4, 0), {4})),
                   "q segment ids and positions must be i32 or i64: segment_ids f32 segment_pos i64");
  EXPECT_CPF_ERROR(SequenceInfo::from_segment_ids(thd, Tensor(), ids(V(4, 0), {4})),
                   "q segment_ids and segment_pos must both be given");
  EXPECT_CPF_ERROR(SequenceInfo::from_segment_ids(thd, ids({1, -1}, {2}), ids({0, 0}, {2})),
                   "segment ids must be >= 0 (0 = padding): id -1 at row 0 token 1");
  EXPECT_CPF_ERROR(SequenceInfo::from_segment_ids(thd, ids({1, 2, 1}, {3}), ids({0, 0, 1}, {3})),
                   "segment 1 of row 0 is not contiguous (tokens 0 and 2 are separated by other ids)");
  EXPECT_CPF_ERROR(SequenceInfo::from_segment_ids(thd, ids(V(4, 1), {2, 2}), ids(V(2, 0), {2}), ids(V(3, 1), {3, 1}),
                                                  ids(V(1, 0), {1})),
                   "q and kv must have the same rows: q segment_ids [2,2] kv segment_ids [3,1]");
  EXPECT_CPF_ERROR(
      SequenceInfo::from_segment_ids(thd, ids({1, 2}, {2}), ids({0, 0}, {2}), ids({2, 1}, {2}), ids({0, 0}, {2})),
      "segments must appear in the same order on q and kv, but row 0 has segment 2 earlier on q");
  const AttentionSpec bshd{.qkv_format = QkvFormat::bshd, .mask = MaskType::padding};
  EXPECT_CPF_ERROR(SequenceInfo::from_segment_ids(bshd, ids({1, 1, 2, 2}, {1, 4}), ids({0, 1, 0, 1}, {1, 4})),
                   "bshd/sbhd hold at most one sequence per row, but row 0 has 2 q and 2 kv segments");
  const AttentionSpec causal{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal};
  EXPECT_CPF_ERROR(SequenceInfo::from_segment_ids(causal, ids({1, 1, 0}, {1, 3}), ids({0, 1, 2}, {1, 3})),
                   "mask causal on bshd/sbhd treats every token of a row as one sequence, but q row 0 has padding");
}

}  // namespace
}  // namespace cpf
