// SequenceInfo constructors, positions and consistency checks.
#include <gtest/gtest.h>

#include "attention/sequence_info.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using V = std::vector<int64_t>;

TEST(SequenceInfo, FromLengthsPackedAndInSlots) {
  const SequenceInfo packed = SequenceInfo::from_lengths({3, 0, 2});
  EXPECT_EQ(packed.cu_seqlens_q, (V{0, 3, 3, 5}));
  EXPECT_EQ(packed.cu_seqlens_q_padded, (V{0, 3, 3, 5}));
  EXPECT_EQ(packed.max_seqlen_q, 3);
  const SequenceInfo rows = SequenceInfo::from_lengths({3, 5}, {4, 1}, 6, 8);
  EXPECT_EQ(rows.num_sequences(), 2);
  EXPECT_EQ(rows.cu_seqlens_q, (V{0, 3, 8}));
  EXPECT_EQ(rows.cu_seqlens_kv, (V{0, 4, 5}));
  EXPECT_EQ(rows.cu_seqlens_q_padded, (V{0, 6, 12}));
  EXPECT_EQ(rows.cu_seqlens_kv_padded, (V{0, 8, 16}));
  EXPECT_EQ(rows.max_seqlen_q, 5);
  EXPECT_EQ(rows.max_seqlen_kv, 4);
  EXPECT_EQ(rows.q_start(1), 6);
  EXPECT_EQ(rows.kv_length(1), 1);
}

TEST(SequenceInfo, FromCuSeqlensWithPaddingBetweenSequences) {
  const SequenceInfo info = SequenceInfo::from_cu_seqlens({0, 3, 5}, {0, 4, 8});
  EXPECT_EQ(info.cu_seqlens_kv, (V{0, 3, 5}));
  EXPECT_EQ(info.cu_seqlens_kv_padded, (V{0, 4, 8}));
  EXPECT_EQ(info.q_storage_tokens(), 8);
  EXPECT_EQ(info.resolved_q_positions(), (V{0, 1, 2, 3, 0, 1, 2, 3}));
  const SequenceInfo cross = SequenceInfo::from_cu_seqlens({0, 2}, {0, 5}, {}, {0, 6});
  EXPECT_EQ(cross.cu_seqlens_q_padded, (V{0, 2}));
  EXPECT_EQ(cross.max_seqlen_kv, 5);
  EXPECT_EQ(cross.kv_storage_tokens(), 6);
}

TEST(SequenceInfo, PositionOffsetsAndExplicitPositions) {
  const SequenceInfo info = SequenceInfo::from_cu_seqlens({0, 2, 5}, {0, 3, 6});
  const SequenceInfo shifted = info.with_position_offsets(10, 0);
  EXPECT_EQ(shifted.q_positions, (V{10, 11, 12, 10, 11, 12}));
  EXPECT_EQ(shifted.kv_positions, (V{0, 1, 2, 0, 1, 2}));
  const SequenceInfo bottom_right = info.with_position_offsets({1, 0}, {0, 0});
  EXPECT_EQ(bottom_right.resolved_q_positions(), (V{1, 2, 3, 0, 1, 2}));
  const SequenceInfo explicit_pos = info.with_positions({5, 6, 0, 7, 8, 9}, {});
  EXPECT_EQ(explicit_pos.resolved_q_positions(), (V{5, 6, 0, 7, 8, 9}));
  EXPECT_EQ(explicit_pos.resolved_kv_positions(), (V{0, 1, 2, 0, 1, 2}));
  EXPECT_NE(info.str().find("cu_seqlens_q_padded=[0,3,6]"), std::string::npos) << info.str();
}

TEST(SequenceInfo, RejectsInconsistentArrays) {
  EXPECT_CPF_ERROR(SequenceInfo::from_lengths({2, -1}), "q_lengths must be >= 0: q_lengths=[2,-1]");
  EXPECT_CPF_ERROR(SequenceInfo::from_lengths({2, 5}, 4), "q_lengths do not fit in slots of 4 tokens: q_lengths=[2,5]");
  EXPECT_CPF_ERROR(SequenceInfo::from_lengths({2}, -3), "the slot size must be >= 0 (0 = packed): slot=-3");
  EXPECT_CPF_ERROR(SequenceInfo::from_lengths({2}, {2, 3}),
                   "q and kv need one length per sequence each: q_lengths=[2] kv_lengths=[2,3]");
  EXPECT_CPF_ERROR(SequenceInfo::from_cu_seqlens({0, 2}, {0, 2, 4}, {}, {}),
                   "describe the same number of sequences: cu_seqlens_q=[0,2] cu_seqlens_kv=[0,2,4]");
  EXPECT_CPF_ERROR(SequenceInfo::from_cu_seqlens({1, 3}), "cu_seqlens_q must start at 0: cu_seqlens_q=[1,3]");
  EXPECT_CPF_ERROR(SequenceInfo::from_cu_seqlens({0, 3, 2}), "cu_seqlens_q must not decrease: cu_seqlens_q=[0,3,2]");
  EXPECT_CPF_ERROR(SequenceInfo::from_cu_seqlens({0, 3, 5}, {0, 4}),
                   "cu_seqlens_q_padded must have one entry per entry of cu_seqlens_q");
  EXPECT_CPF_ERROR(SequenceInfo::from_cu_seqlens({0, 3, 5}, {0, 2, 6}),
                   "sequence 0 has 3 tokens but a slot of 2 (slots must be ordered and hold their sequence)");
  EXPECT_CPF_ERROR(SequenceInfo::from_cu_seqlens({0, 3}, {-1, 3}), "storage offsets must be >= 0");
  SequenceInfo low = SequenceInfo::from_lengths({4});
  low.max_seqlen_kv = 2;
  EXPECT_CPF_ERROR(low.check(), "max_seqlen_kv=2 is below the longest sequence (4)");
  EXPECT_CPF_ERROR(low.with_positions({0, 1}, {}), "q_positions has 2 entries but the storage holds 4 tokens");
  EXPECT_CPF_ERROR(SequenceInfo::from_lengths({4, 2}).with_position_offsets(V{1}, V{0, 0}),
                   "need one position offset per sequence (2): q_offsets=[1] kv_offsets=[0,0]");
}

}  // namespace
}  // namespace cpf
