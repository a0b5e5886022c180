// dot_product_attention beyond the grid: THD against per-sequence BSHD, empty and one-token
// sequences, padded storage and fully masked rows (exact zeros, lse = -inf, no NaN), position
// offsets as CP tiles, the LSE merge of KV halves, tile skipping counts, dtypes and schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "tests/attention/attention_support.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::run_attention;

constexpr double kInf = std::numeric_limits<double>::infinity();

auto dpa(const AttentionSpec& spec, const std::optional<SequenceInfo>& seq, const AttentionKernelConfig& config = {}) {
  return [=](const Tensor& q, const Tensor& k, const Tensor& v) {
    auto r = dot_product_attention(q, k, v, spec, seq, config);
    return std::pair{r.out, r.lse};
  };
}

bool no_nan(const Tensor& t) {
  for (double x : t.to_vector<double>()) {
    if (std::isnan(x)) return false;
  }
  return true;
}

// Every element of token rows [begin, end) along dim 0 of a thd tensor equals `value`.
void expect_rows_equal(const Tensor& t, int64_t begin, int64_t end, double value, const char* what) {
  for (int64_t i = begin; i < end; ++i) {
    for (double x : raw::select(t, 0, i).to_vector<double>()) EXPECT_EQ(x, value) << what << " token " << i;
  }
}

TEST(AttentionThd, EqualsEachSequenceAloneInBshd) {
  // Lengths 5, 0, 1, 9 in slots of 6, 2, 1, 12 (padding between sequences), plus 3 tokens past the end.
  const std::vector<int64_t> cu{0, 5, 5, 6, 15}, cu_padded{0, 6, 8, 9, 21};
  const int64_t t = 24;
  for (MaskType mask : {MaskType::padding, MaskType::padding_causal}) {
    const AttentionSpec thd{.qkv_format = QkvFormat::thd, .mask = mask, .window = {3, -1}};
    const Tensor q = random_tensor({t, 4, 8}, DType::f64, 1), k = random_tensor({t, 2, 8}, DType::f64, 2);
    const Tensor v = random_tensor({t, 2, 5}, DType::f64, 3), dout = random_tensor({t, 4, 5}, DType::f64, 4);
    const Tensor dlse = random_tensor({4, t}, DType::f64, 5);
    const auto packed = run_attention(
        dpa(thd, SequenceInfo::from_cu_seqlens(cu, cu_padded), {.block_q = 4, .block_kv = 3}), q, k, v, dout, dlse);
    const AttentionSpec bshd{.qkv_format = QkvFormat::bshd,
                             .mask = is_causal(mask) ? MaskType::causal : MaskType::no_mask,
                             .window = {3, -1}};
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      const int64_t start = cu_padded[n], len = cu[n + 1] - cu[n];
      auto rows = [&](const Tensor& x) { return raw::unsqueeze(raw::contiguous(raw::narrow(x, 0, start, len)), 0); };
      const auto alone = run_attention(dpa(bshd, std::nullopt), rows(q), rows(k), rows(v), rows(dout),
                                       raw::unsqueeze(raw::narrow(dlse, 1, start, len), 0));
      EXPECT_TRUE(all_close(rows(packed.out), alone.out, 1e-12, 1e-12)) << "sequence " << n;
      EXPECT_TRUE(all_close(raw::narrow(packed.lse, 1, start, len), raw::select(alone.lse, 0, 0), 1e-12, 1e-12));
      EXPECT_TRUE(all_close(rows(packed.dq), alone.dq, 1e-12, 1e-12)) << "sequence " << n;
      EXPECT_TRUE(all_close(rows(packed.dk), alone.dk, 1e-12, 1e-12)) << "sequence " << n;
      EXPECT_TRUE(all_close(rows(packed.dv), alone.dv, 1e-12, 1e-12)) << "sequence " << n;
    }
    // Padding between and after the sequences: exact zeros and -inf, even with nonzero seeds there.
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{5, 6}, {6, 8}, {18, 24}}) {
      for (const Tensor* g : {&packed.out, &packed.dq, &packed.dk, &packed.dv})
        expect_rows_equal(*g, begin, end, 0.0, "pad");
      for (int64_t i = begin; i < end; ++i) {
        for (double x : raw::select(packed.lse, 1, i).to_vector<double>()) EXPECT_EQ(x, -kInf);
      }
    }
  }
}

TEST(AttentionThd, OneTokenSequenceReturnsItsValue) {
  // A query alone with one key: softmax over one element, out = v, lse = scale * q.k.
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal, .softmax_scale = 0.5};
  const Tensor q = random_tensor({1, 1, 4}, DType::f64, 1), k = random_tensor({1, 1, 4}, DType::f64, 2);
  const Tensor v = random_tensor({1, 1, 3}, DType::f64, 3);
  const AttentionOutput r = dot_product_attention(q, k, v, spec, SequenceInfo::from_lengths({1}));
  EXPECT_TRUE(all_close(r.out, v, 1e-15, 0));
  double dot = 0;
  const auto qv = q.to_vector<double>(), kv = k.to_vector<double>();
  for (size_t i = 0; i < qv.size(); ++i) dot += qv[i] * kv[i];
  EXPECT_NEAR(r.lse.item<double>(), 0.5 * dot, 1e-15);
}

TEST(AttentionMasking, FullyMaskedRowsAreExactZerosWithoutNaN) {
  // q positions 3..8 against kv positions 0..5, causal with left = 1: queries at 7 and 8 see nothing.
  // A second sequence has no keys at all (cross-attention against an empty kv).
  SequenceInfo info = SequenceInfo::from_lengths({6, 3}, {6, 0});
  info = info.with_position_offsets({3, 0}, {0, 0});
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal, .window = {1, 0}};
  const Tensor q = random_tensor({9, 2, 4}, DType::f64, 1), k = random_tensor({6, 1, 4}, DType::f64, 2);
  const Tensor v = random_tensor({6, 1, 4}, DType::f64, 3);
  const auto r = run_attention(dpa(spec, info, {.block_q = 2, .block_kv = 3}), q, k, v,
                               random_tensor({9, 2, 4}, DType::f64, 4), random_tensor({2, 9}, DType::f64, 5));
  for (const Tensor* t : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv}) EXPECT_TRUE(no_nan(*t));
  // Keys at positions 0 and 1 are seen by no query: exactly zero gradients, not exp(-inf) rounding.
  expect_rows_equal(r.dk, 0, 2, 0.0, "unseen dk");
  expect_rows_equal(r.dv, 0, 2, 0.0, "unseen dv");
  for (int64_t i : {4, 5, 6, 7, 8}) {
    expect_rows_equal(raw::narrow(r.out, 0, i, 1), 0, 1, 0.0, "masked out");
    expect_rows_equal(raw::narrow(r.dq, 0, i, 1), 0, 1, 0.0, "masked dq");
    for (double x : raw::select(r.lse, 1, i).to_vector<double>()) EXPECT_EQ(x, -kInf);
  }
  testing::expect_matches_reference(q, k, v, spec, info, {.block_q = 2, .block_kv = 2});
}

TEST(AttentionPositions, CpTilesFromPositionOffsets) {
  // One 8-token sequence split into two 4-token halves, as a CP step sees them.
  const Tensor q = random_tensor({1, 4, 2, 4}, DType::f64, 1), k = random_tensor({1, 4, 2, 4}, DType::f64, 2);
  const Tensor v = random_tensor({1, 4, 2, 4}, DType::f64, 3);
  const AttentionSpec causal{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal};
  const SequenceInfo rows = SequenceInfo::from_lengths({4}, {4}, 4, 4);
  // Diagonal (same offsets), full (q after kv), bottom-right and fully hidden (q before kv) tiles.
  for (auto [q_off, kv_off] : {std::pair<int64_t, int64_t>{4, 4}, {4, 0}, {2, 0}, {0, 4}}) {
    testing::expect_matches_reference(q, k, v, causal, rows.with_position_offsets(q_off, kv_off),
                                      {.block_q = 2, .block_kv = 2});
  }
  const auto full =
      raw::attention_forward(q, k, v, causal, rows.with_position_offsets(4, 0), {.block_q = 2, .block_kv = 2});
  EXPECT_EQ(full.tiles.partial, 0);
  EXPECT_EQ(full.tiles.skipped, 0);
  const auto none =
      raw::attention_forward(q, k, v, causal, rows.with_position_offsets(0, 4), {.block_q = 2, .block_kv = 2});
  EXPECT_EQ(none.tiles.computed(), 0);
  for (double x : none.lse.to_vector<double>()) EXPECT_EQ(x, -kInf);
}

TEST(AttentionPositions, DualChunkLayoutWithExplicitPositions) {
  // Rank 0 of CP size 2 holds chunks C0 and C3 of a 16-token sequence: positions 0..3 and 12..15.
  const std::vector<int64_t> pos{0, 1, 2, 3, 12, 13, 14, 15};
  const SequenceInfo info = SequenceInfo::from_lengths({8}, {8}, 8, 8).with_positions(pos, pos);
  const Tensor q = random_tensor({1, 8, 2, 4}, DType::f64, 1), k = random_tensor({1, 8, 1, 4}, DType::f64, 2);
  const Tensor v = random_tensor({1, 8, 1, 3}, DType::f64, 3);
  for (AttentionWindow w : {AttentionWindow{-1, 0}, AttentionWindow{10, 0}}) {
    testing::expect_matches_reference(q, k, v, {.qkv_format = QkvFormat::bshd, .mask = MaskType::causal, .window = w},
                                      info, {.block_q = 3, .block_kv = 3});
  }
}

TEST(AttentionLse, MergingKvHalvesGivesFullAttention) {
  // out = sum_i exp(lse_i - lse) out_i with lse = log sum_i exp(lse_i): the CP merge rule.
  const Tensor q = random_tensor({2, 6, 2, 4}, DType::f64, 1), k = random_tensor({2, 12, 2, 4}, DType::f64, 2);
  const Tensor v = random_tensor({2, 12, 2, 3}, DType::f64, 3);
  const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal, .window = {7, 0}};
  const SequenceInfo all = SequenceInfo::from_lengths({6, 6}, {12, 12}, 6, 12).with_position_offsets(6, 0);
  const AttentionOutput ref = dot_product_attention(q, k, v, spec, all);
  const SequenceInfo half = SequenceInfo::from_lengths({6, 6}, {6, 6}, 6, 6);
  const AttentionOutput a = dot_product_attention(q, raw::narrow(k, 1, 0, 6), raw::narrow(v, 1, 0, 6), spec,
                                                  half.with_position_offsets(6, 0));
  const AttentionOutput b = dot_product_attention(q, raw::narrow(k, 1, 6, 6), raw::narrow(v, 1, 6, 6), spec,
                                                  half.with_position_offsets(6, 6));
  const Tensor lse = raw::logsumexp(raw::stack({a.lse, b.lse}, 0), {0});  // (2, h, s)
  auto weight = [&](const Tensor& l) {                                    // (b, h, s) -> (b, s, h, 1)
    return raw::unsqueeze(raw::permute(raw::exp(raw::sub(l, lse)), {0, 2, 1}), -1);
  };
  const Tensor merged = raw::add(raw::mul(weight(a.lse), a.out), raw::mul(weight(b.lse), b.out));
  EXPECT_TRUE(all_close(lse, ref.lse, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(merged, ref.out, 1e-12, 1e-12));
}

TEST(AttentionTiles, CausalSkipsTilesAboveTheDiagonal) {
  const Tensor q = random_tensor({1, 256, 2, 16}, DType::f32, 1);
  const AttentionSpec causal{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal};
  const auto fwd = raw::attention_forward(q, q, q, causal);
  // 4 x 4 blocks of 64 per head: 6 below the diagonal, 4 on it, 6 above (skipped); 2 heads.
  EXPECT_EQ(fwd.tiles.full, 12);
  EXPECT_EQ(fwd.tiles.partial, 8);
  EXPECT_EQ(fwd.tiles.skipped, 12);
  const auto grads = raw::attention_backward(fwd.out, Tensor(), q, q, q, fwd.out, fwd.lse, causal);
  EXPECT_EQ(grads.tiles.full, 12);
  EXPECT_EQ(grads.tiles.partial, 8);
  EXPECT_EQ(grads.tiles.skipped, 12);
  // A sliding window of 64 keys: blocks on the diagonal and the one before it are computed.
  const auto window =
      raw::attention_forward(q, q, q, {.qkv_format = QkvFormat::bshd, .mask = MaskType::causal, .window = {64, 0}});
  EXPECT_EQ(window.tiles.computed(), 2 * 7);
  EXPECT_EQ(window.tiles.skipped, 2 * 9);
  const auto plain = raw::attention_forward(q, q, q, {.qkv_format = QkvFormat::bshd});
  EXPECT_EQ(plain.tiles.full, 32);
}

TEST(AttentionTiles, DefaultTilesOnLongerSequences) {
  // 150 tokens: 64-token tiles with a remainder, against the reference.
  for (MaskType mask : {MaskType::no_mask, MaskType::causal}) {
    const Tensor q = random_tensor({1, 150, 2, 8}, DType::f64, 1), k = random_tensor({1, 150, 1, 8}, DType::f64, 2);
    const Tensor v = random_tensor({1, 150, 1, 8}, DType::f64, 3);
    testing::expect_matches_reference(q, k, v, {.qkv_format = QkvFormat::bshd, .mask = mask, .window = {70, -1}},
                                      std::nullopt);
  }
}

TEST(AttentionDtypes, Float32AndBfloat16FollowFloat64) {
  const AttentionSpec spec{.qkv_format = QkvFormat::sbhd, .mask = MaskType::causal};
  const Tensor q = random_tensor({70, 2, 2, 8}, DType::f64, 1), k = random_tensor({70, 2, 2, 8}, DType::f64, 2);
  const Tensor v = random_tensor({70, 2, 2, 8}, DType::f64, 3);
  const Tensor dout = random_tensor({70, 2, 2, 8}, DType::f64, 4), dlse = random_tensor({2, 2, 70}, DType::f64, 5);
  const auto ref = run_attention(dpa(spec, std::nullopt), q, k, v, dout, dlse);
  for (auto [dtype, tol] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 3e-2}}) {
    auto cast = [&](const Tensor& t) { return raw::to(t, dtype); };
    const auto r = run_attention(dpa(spec, std::nullopt), cast(q), cast(k), cast(v), cast(dout), dlse);
    EXPECT_EQ(r.out.dtype(), dtype);
    EXPECT_EQ(r.lse.dtype(), DType::f32);
    EXPECT_EQ(r.dq.dtype(), dtype);
    EXPECT_TRUE(all_close(r.out, ref.out, tol, tol)) << dtype_name(dtype);
    EXPECT_TRUE(all_close(r.lse, ref.lse, tol, tol)) << dtype_name(dtype);
    EXPECT_TRUE(all_close(r.dq, ref.dq, tol, tol)) << dtype_name(dtype);
    EXPECT_TRUE(all_close(r.dk, ref.dk, tol, tol)) << dtype_name(dtype);
    EXPECT_TRUE(all_close(r.dv, ref.dv, tol, tol)) << dtype_name(dtype);
  }
}

TEST(AttentionInputs, NonContiguousViewsAndLseOnlyGradients) {
  // q/k/v as transposed views of (b, h, s, d) tensors; a loss on lse alone (dout never defined).
  const Tensor base = random_tensor({2, 3, 9, 4}, DType::f64, 1);
  Tensor x = raw::clone(base).set_requires_grad(true);
  const Tensor view = transpose(x, 1, 2);  // (b, s, h, d), not contiguous
  const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal};
  backward(sum(dot_product_attention(view, view, view, spec).lse));
  Tensor y = raw::clone(base).set_requires_grad(true);
  backward(sum(
      testing::naive_attention(transpose(y, 1, 2), transpose(y, 1, 2), transpose(y, 1, 2), spec, std::nullopt).lse));
  EXPECT_TRUE(all_close(x.grad(), y.grad(), 1e-12, 1e-12));
}

TEST(AttentionSchedules, SplitAndByKvHeadAgree) {
  const Tensor q = random_tensor({2, 100, 4, 8}, DType::f64, 1), k = random_tensor({2, 100, 2, 8}, DType::f64, 2);
  const Tensor v = random_tensor({2, 100, 2, 8}, DType::f64, 3), dout = random_tensor({2, 100, 4, 8}, DType::f64, 4);
  const AttentionSpec spec{.qkv_format = QkvFormat::bshd, .mask = MaskType::causal, .window = {40, 0}};
  const auto fwd = raw::attention_forward(q, k, v, spec);
  const auto a = raw::attention_backward(dout, Tensor(), q, k, v, fwd.out, fwd.lse, spec, std::nullopt,
                                         {.backward = BackwardSchedule::by_kv_head});
  const auto b = raw::attention_backward(dout, Tensor(), q, k, v, fwd.out, fwd.lse, spec, std::nullopt,
                                         {.backward = BackwardSchedule::split});
  EXPECT_TRUE(all_close(a.dq, b.dq, 1e-13, 0));
  EXPECT_TRUE(all_close(a.dk, b.dk, 1e-13, 0));
  EXPECT_TRUE(all_close(a.dv, b.dv, 1e-13, 0));
  EXPECT_EQ(a.tiles.computed(), b.tiles.computed());
}

}  // namespace
}  // namespace cpf
