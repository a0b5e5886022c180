// The host-side mapping of an AttentionProblem onto cuDNN's index-based SDPA
// (attention/cuda/cudnn/problem_mapping.h): batch entries, lengths, the padding form, the band bounds
// r and w derived from positions, and the tokens whose results must be fixed up. No GPU needed.
#include <gtest/gtest.h>

#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda::cudnn {
namespace {

AttentionProblem problem(QkvFormat format, MaskType mask, AttentionWindow window, int64_t batch, int64_t s_q,
                         int64_t s_kv, const std::optional<SequenceInfo>& seq = std::nullopt) {
  auto shape = [&](int64_t s) -> Shape {
    if (format == QkvFormat::thd) return {s, 2, 8};
    if (format == QkvFormat::sbhd) return {s, batch, 2, 8};
    return {batch, s, 2, 8};
  };
  const Tensor q = empty(shape(s_q), {.dtype = DType::bf16}), k = empty(shape(s_kv), {.dtype = DType::bf16});
  return check_attention_inputs(q, k, k, {.qkv_format = format, .mask = mask, .window = window}, seq, {});
}

TEST(CudnnMapping, PlainCausalNeedsOnlyTheRightBound) {
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::bshd, MaskType::causal, {}, 2, 256, 256));
  ASSERT_EQ(m.reason, "");
  EXPECT_EQ(m.b, 2);
  EXPECT_EQ(m.s_q, 256);
  EXPECT_FALSE(m.padding);
  EXPECT_TRUE(m.right_bound);
  EXPECT_EQ(m.right, 0);
  EXPECT_FALSE(m.left_bound);
  EXPECT_FALSE(m.bottom_right);
  EXPECT_TRUE(m.q_undefined.empty());
  EXPECT_TRUE(m.kv_undefined.empty());
}

TEST(CudnnMapping, SlidingWindowPassesLeftPlusOne) {
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::bshd, MaskType::causal, {63, -1}, 1, 300, 300));
  ASSERT_EQ(m.reason, "");
  EXPECT_TRUE(m.right_bound);
  EXPECT_TRUE(m.left_bound);
  EXPECT_EQ(m.left, 64);  // cuDNN keeps col + w > row: w = left + 1 for the inclusive window
}

TEST(CudnnMapping, SkvSixtyFourModulo128UsesThePaddingForm) {
  EXPECT_TRUE(map_to_cudnn(problem(QkvFormat::bshd, MaskType::no_mask, {}, 1, 100, 192)).padding);
  EXPECT_FALSE(map_to_cudnn(problem(QkvFormat::bshd, MaskType::no_mask, {}, 1, 100, 256)).padding);
}

TEST(CudnnMapping, ShiftedDiagonalAndBoundsThatHideNothing) {
  // Queries at positions 64.. against keys 0..255, causal: r = 64.
  const auto ahead = SequenceInfo::from_lengths({128}, {256}, 128, 256).with_position_offsets(64, 0);
  SdpaMapping m = map_to_cudnn(problem(QkvFormat::bshd, MaskType::causal, {}, 1, 128, 256, ahead));
  ASSERT_EQ(m.reason, "");
  EXPECT_TRUE(m.right_bound);
  EXPECT_EQ(m.right, 64);
  EXPECT_FALSE(m.any_fully_masked_row);
  // Keys 0..127 entirely before queries 128..255 (a CP ring step): every key visible, no mask.
  const auto after = SequenceInfo::from_lengths({128}, 128).with_position_offsets(128, 0);
  m = map_to_cudnn(problem(QkvFormat::bshd, MaskType::causal, {}, 1, 128, 128, after));
  ASSERT_EQ(m.reason, "");
  EXPECT_FALSE(m.right_bound);
  EXPECT_FALSE(m.left_bound);
}

TEST(CudnnMapping, RowsThatSeeNoKeyAreMarked) {
  // Keys at positions 64.., queries at 0..127, causal: rows 0..63 see nothing.
  const auto behind = SequenceInfo::from_lengths({128}, 128).with_position_offsets(0, 64);
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::bshd, MaskType::causal, {}, 1, 128, 128, behind));
  ASSERT_EQ(m.reason, "");
  EXPECT_EQ(m.right, -64);
  EXPECT_TRUE(m.any_fully_masked_row);
  ASSERT_EQ(m.q_undefined.size(), 128u);
  for (int64_t i = 0; i < 128; ++i) EXPECT_EQ(m.q_undefined[static_cast<size_t>(i)], i < 64 ? 1 : 0) << "row " << i;
  EXPECT_TRUE(m.kv_undefined.empty());
}

TEST(CudnnMapping, ThdDropsEmptySequencesAndRoundsLengths) {
  // Sequence 1 has no keys: left out of cuDNN's batch, its queries fixed up; padded slots too.
  const auto seq =
      SequenceInfo::from_cu_seqlens({0, 100, 150, 450}, {0, 100, 100, 400}, {0, 110, 160, 460}, {0, 100, 100, 400});
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 460, 400, seq));
  ASSERT_EQ(m.reason, "");
  EXPECT_EQ(m.b, 2);
  EXPECT_EQ(m.seq_len_q, (std::vector<int32_t>{100, 300}));
  EXPECT_EQ(m.seq_len_kv, (std::vector<int32_t>{100, 300}));
  EXPECT_EQ(m.q_token, (std::vector<int64_t>{0, 160}));
  EXPECT_EQ(m.s_q, 384);  // 300 rounded up to a multiple of 128
  EXPECT_TRUE(m.ragged);
  EXPECT_TRUE(m.padding);
  ASSERT_EQ(m.q_undefined.size(), 460u);
  EXPECT_EQ(m.q_undefined[105], 1);  // padded slot of sequence 0
  EXPECT_EQ(m.q_undefined[120], 1);  // sequence 1: no keys
  EXPECT_EQ(m.q_undefined[200], 0);
  EXPECT_TRUE(m.kv_undefined.empty());
}

TEST(CudnnMapping, BottomRightOffsetsPerSequence) {
  const auto seq = SequenceInfo::from_lengths({100, 300}, {300, 400}).with_position_offsets({200, 100}, {0, 0});
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 400, 700, seq));
  ASSERT_EQ(m.reason, "");
  EXPECT_TRUE(m.bottom_right);
  EXPECT_TRUE(m.right_bound);
  EXPECT_EQ(m.right, 0);
}

TEST(CudnnMapping, ReasonsForWhatIndexMasksCannotExpress) {
  const auto differ = SequenceInfo::from_lengths({64, 64}).with_position_offsets({0, 10}, {0, 0});
  EXPECT_NE(map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 128, 128, differ))
                .reason.find("not one band with the same diagonal in every sequence"),
            std::string::npos);
  const auto not_at_zero = SequenceInfo::from_cu_seqlens({0, 32, 64}, {0, 32, 64}, {8, 64, 128}, {8, 64, 128});
  EXPECT_NE(map_to_cudnn(problem(QkvFormat::bshd, MaskType::padding, {}, 2, 64, 64, not_at_zero))
                .reason.find("does not start at index 0"),
            std::string::npos);
}

// Positions [a, a + n) followed by [b, b + n): a rank's two dual chunks.
std::vector<int64_t> two_runs(int64_t a, int64_t b, int64_t n) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(a + i);
  for (int64_t i = 0; i < n; ++i) p.push_back(b + i);
  return p;
}

// The tiles of the causal ring (docs/cp_design.md, "The tile cases") for S = 256 over 2 ranks (chunks of
// 64): rank 0 holds positions 0..63 and 192..255, rank 1 holds 64..191. Each must be one cuDNN call.
TEST(CudnnMapping, RingDiagonalTileIsOneCausalBlock) {
  const auto pos = two_runs(0, 192, 64);
  const auto seq = SequenceInfo::from_lengths({128}).with_positions(pos, pos);
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 128, 128, seq));
  ASSERT_EQ(m.reason, "");
  EXPECT_TRUE(m.right_bound);
  EXPECT_EQ(m.right, 0);  // identical increasing positions: position order is index order
  EXPECT_FALSE(m.left_bound);
  EXPECT_FALSE(m.bottom_right);
  EXPECT_TRUE(m.q_undefined.empty());
  EXPECT_TRUE(m.kv_undefined.empty());
}

TEST(CudnnMapping, RingLowerTileKeepsTheFirstKeyHalfUnmasked) {
  // Rank 1's queries (64..191) against rank 0's keys (0..63, 192..255): all see 0..63, none 192..255.
  const auto seq = SequenceInfo::from_lengths({128}).with_positions(two_runs(64, 128, 64), two_runs(0, 192, 64));
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 128, 128, seq));
  ASSERT_EQ(m.reason, "");
  ASSERT_EQ(m.b, 1);
  EXPECT_EQ(m.kv_token[0], 0);
  EXPECT_EQ(m.seq_len_kv[0], 64);
  EXPECT_EQ(m.seq_len_q[0], 128);
  EXPECT_FALSE(m.right_bound);
  EXPECT_FALSE(m.left_bound);
  EXPECT_TRUE(m.q_undefined.empty());
  ASSERT_EQ(m.kv_undefined.size(), 128u);
  EXPECT_EQ(m.kv_undefined[63], 0);
  EXPECT_EQ(m.kv_undefined[64], 1);  // dK/dV of the hidden half are zero
}

TEST(CudnnMapping, RingUpperTileKeepsTheSecondQueryHalfUnmasked) {
  // Rank 0's queries (0..63, 192..255) against rank 1's keys (64..191): 0..63 see nothing, 192.. all.
  const auto seq = SequenceInfo::from_lengths({128}).with_positions(two_runs(0, 192, 64), two_runs(64, 128, 64));
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 128, 128, seq));
  ASSERT_EQ(m.reason, "");
  EXPECT_EQ(m.q_token[0], 64);
  EXPECT_EQ(m.seq_len_q[0], 64);
  EXPECT_EQ(m.seq_len_kv[0], 128);
  EXPECT_FALSE(m.right_bound);
  ASSERT_EQ(m.q_undefined.size(), 128u);
  EXPECT_EQ(m.q_undefined[0], 1);  // out 0, lse -inf: the merge skips them
  EXPECT_EQ(m.q_undefined[64], 0);
  EXPECT_TRUE(m.kv_undefined.empty());
}

TEST(CudnnMapping, SecondChunkAgainstBothChunksIsAShiftedDiagonal) {
  // Queries 192..255 against keys 0..63, 192..255: all of the first run, then causal: r = 64.
  std::vector<int64_t> q(64);
  for (int64_t i = 0; i < 64; ++i) q[static_cast<size_t>(i)] = 192 + i;
  const auto info = SequenceInfo::from_lengths({64}, {128}, 64, 128).with_positions(q, two_runs(0, 192, 64));
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 64, 128, info));
  ASSERT_EQ(m.reason, "");
  EXPECT_TRUE(m.right_bound);
  EXPECT_EQ(m.right, 64);
  EXPECT_FALSE(m.bottom_right);
}

TEST(CudnnMapping, KeysOutOfPositionOrderOrTwoDiagonalsAreRejected) {
  const auto unsorted = SequenceInfo::from_lengths({128}).with_positions(two_runs(0, 64, 64), two_runs(64, 0, 64));
  EXPECT_NE(map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 128, 128, unsorted))
                .reason.find("the key positions of sequence 0 do not increase (127 then 0"),
            std::string::npos);
  // all_gather's local queries (two chunks) against the whole sequence: two diagonals.
  std::vector<int64_t> all(256);
  for (int64_t i = 0; i < 256; ++i) all[static_cast<size_t>(i)] = i;
  const auto gathered = SequenceInfo::from_lengths({128}, {256}, 128, 256).with_positions(two_runs(0, 192, 64), all);
  EXPECT_NE(
      map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 128, 256, gathered)).reason.find("not one band"),
      std::string::npos);
}

std::vector<int64_t> iota_from(int64_t start, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = start + i;
  return p;
}

TEST(CudnnMapping, SlidingWindowOverTwoChunksUsesTheSearchedIntervals) {
  // q = kv = positions 0..63, 192..255 (not contiguous). Window left 200: a row of the second chunk at
  // position 192 + j sees the first chunk from position j - 8 on, i.e. index row - 72: w = 73.
  const auto pos = two_runs(0, 192, 64);
  const auto seq = SequenceInfo::from_lengths({128}).with_positions(pos, pos);
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {200, -1}, 1, 128, 128, seq));
  ASSERT_EQ(m.reason, "");
  EXPECT_TRUE(m.right_bound);
  EXPECT_EQ(m.right, 0);
  EXPECT_TRUE(m.left_bound);
  EXPECT_EQ(m.left, 73);
  // Window left 31 would reach into the gap between the chunks: no band reproduces that.
  const SdpaMapping gap = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {31, -1}, 1, 128, 128, seq));
  EXPECT_NE(gap.reason.find("not one band"), std::string::npos) << gap.reason;
}

TEST(CudnnMapping, BottomRightWithALeftBound) {
  // bshd rows (not trimmed) whose queries end where their keys end, window left 15: the diagonals
  // agree only bottom-right aligned, and w is the shifted left constant plus one.
  const auto seq = SequenceInfo::from_lengths({32, 64}, {64, 128}, 64, 128).with_position_offsets({32, 64}, {0, 0});
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::bshd, MaskType::padding_causal, {15, -1}, 2, 64, 128, seq));
  ASSERT_EQ(m.reason, "");
  EXPECT_TRUE(m.bottom_right);
  EXPECT_TRUE(m.padding);
  EXPECT_EQ(m.right, 0);
  EXPECT_TRUE(m.left_bound);
  EXPECT_EQ(m.left, 16);
  // thd trims each sequence to the keys its queries see, after which the same diagonal is top-left.
  const auto thd = SequenceInfo::from_lengths({32, 64}, {64, 128}).with_position_offsets({32, 64}, {0, 0});
  const SdpaMapping t = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {15, -1}, 1, 96, 192, thd));
  ASSERT_EQ(t.reason, "");
  EXPECT_FALSE(t.bottom_right);
  EXPECT_EQ(t.right, 15);
  EXPECT_EQ(t.left, 1);
}

TEST(CudnnMapping, TrimsLeadingKeysAndTrailingQueriesAndDropsHiddenEntries) {
  // Sequence 0: queries at 0..63 against keys 100..163: nothing visible (causal), dropped.
  // Sequence 1: queries at 10..73 against keys 0..127: keys 74.. are seen by nobody (trimmed at the end),
  // and with window left 9 keys 0..0 are seen by nobody either (trimmed at the start).
  std::vector<int64_t> q = iota_from(0, 64), k = iota_from(100, 64);
  const auto q1 = iota_from(10, 64), k1 = iota_from(0, 128);
  q.insert(q.end(), q1.begin(), q1.end());
  k.insert(k.end(), k1.begin(), k1.end());
  const auto seq =
      SequenceInfo::from_cu_seqlens({0, 64, 128}, {0, 64, 192}, {0, 64, 128}, {0, 64, 192}).with_positions(q, k);
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {9, -1}, 1, 128, 192, seq));
  ASSERT_EQ(m.reason, "");
  ASSERT_EQ(m.b, 1);
  EXPECT_EQ(m.q_token[0], 64);
  EXPECT_EQ(m.seq_len_q[0], 64);
  EXPECT_EQ(m.kv_token[0], 64 + 1);  // key position 1 is the first any query (position 10) sees
  EXPECT_EQ(m.seq_len_kv[0], 73);    // through key position 73
  ASSERT_EQ(m.q_undefined.size(), 128u);
  EXPECT_EQ(m.q_undefined[0], 1);  // the dropped sequence's queries
  EXPECT_EQ(m.q_undefined[64], 0);
  ASSERT_EQ(m.kv_undefined.size(), 192u);
  EXPECT_EQ(m.kv_undefined[64], 1);
  EXPECT_EQ(m.kv_undefined[65], 0);
  const auto hidden = SequenceInfo::from_lengths({64}).with_positions(iota_from(0, 64), iota_from(100, 64));
  EXPECT_EQ(map_to_cudnn(problem(QkvFormat::thd, MaskType::causal, {}, 1, 64, 64, hidden)).reason,
            "no query sees a key");
}

TEST(CudnnMapping, AHiddenRowTheBandWouldShowIsRejected) {
  // bshd (no trimming): queries 0..63 then 100..163 against keys 0..63 with window left 9: the second
  // half sees nothing, but a band fitted to the first half would show it the last keys.
  const auto seq =
      SequenceInfo::from_lengths({128}, {64}, 128, 64).with_positions(two_runs(0, 100, 64), iota_from(0, 64));
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::bshd, MaskType::causal, {9, -1}, 1, 128, 64, seq));
  EXPECT_NE(m.reason.find("sees no key, but cuDNN's band would show it keys"), std::string::npos) << m.reason;
}

TEST(CudnnMapping, ALeftBoundWithMoreQueriesThanKeysUsesThePaddingForm) {
  const SdpaMapping m = map_to_cudnn(problem(QkvFormat::bshd, MaskType::causal, {15, -1}, 1, 256, 128,
                                             SequenceInfo::from_lengths({256}, {128}, 256, 128)));
  ASSERT_EQ(m.reason, "");
  EXPECT_TRUE(m.left_bound);
  EXPECT_TRUE(m.padding);
}

}  // namespace
}  // namespace cpf::attention_cuda::cudnn
