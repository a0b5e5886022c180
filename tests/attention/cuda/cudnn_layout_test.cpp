// How cuDNN attention reads q, k, v in memory (attention/cuda/cudnn/strided_layout.h): the views that
// split one fused q/k/v projection map onto the graph's strides without a copy, the backward's
// gradients mirror that projection's layout in one buffer, and anything cuDNN cannot read as it is
// (an inner stride, a 16-byte misalignment) is refused so that it is copied. No GPU needed.
#include <gtest/gtest.h>

#include "attention/cuda/cudnn/strided_layout.h"
#include "attention/nn/attention_layout.h"
#include "framework/autograd/functions/linear_cat.h"
#include "framework/nn/linear.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"

namespace cpf::attention_cuda::cudnn {
namespace {

constexpr int64_t kHq = 4, kHkv = 2, kD = 16, kRow = (kHq + 2 * kHkv) * kD;  // (h_q + 2 h_kv) d = 128

struct Qkv {
  Tensor packed, q, k, v;  // packed (.., kRow); q (.., Hq, D), k and v (.., Hkv, D): views of it
};

// What MultiHeadAttention::project_qkv does: one (.., kRow) buffer split into q, k, v heads.
Qkv split_qkv(const Tensor& packed) {
  const std::vector<Tensor> parts = raw::split(packed, std::vector<int64_t>{kHq * kD, kHkv * kD, kHkv * kD}, -1);
  using nn::split_heads;
  return {packed, split_heads(parts[0], kHq, kD), split_heads(parts[1], kHkv, kD), split_heads(parts[2], kHkv, kD)};
}

TEST(CudnnLayout, DenseTensorsKeepTheDenseStrides) {
  const Tensor q = empty({2, 8, kHq, kD}, {.dtype = DType::bf16});  // (B, S, H, D)
  const auto l = in_place_layout(q, QkvFormat::bshd);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->strides, (dense_layout(QkvFormat::bshd, 2, 8, kHq, kD).strides));
  EXPECT_EQ(l->strides, (Strides4{8 * kHq * kD, kD, kHq * kD, 1}));
}

TEST(CudnnLayout, ThdSplitOfOneProjectionMapsWithoutACopy) {
  const Qkv t = split_qkv(empty({10, kRow}, {.dtype = DType::bf16}));  // (T, kRow)
  const auto lq = in_place_layout(t.q, QkvFormat::thd), lk = in_place_layout(t.k, QkvFormat::thd),
             lv = in_place_layout(t.v, QkvFormat::thd);
  ASSERT_TRUE(lq && lk && lv);
  // (b, h, s, d): heads d apart, tokens a whole row apart; b spans every token (ragged offsets override it).
  EXPECT_EQ(lq->strides, (Strides4{10 * kRow, kD, kRow, 1}));
  EXPECT_EQ(lk->strides, (Strides4{10 * kRow, kD, kRow, 1}));
  EXPECT_EQ(lq->row_stride, kRow);
  EXPECT_EQ(lv->row_stride, kRow);
}

TEST(CudnnLayout, BshdAndSbhdSplitsMapWithoutACopy) {
  const Qkv b = split_qkv(empty({2, 6, kRow}, {.dtype = DType::bf16}));  // (B, S, kRow)
  const auto lb = in_place_layout(b.k, QkvFormat::bshd);
  ASSERT_TRUE(lb.has_value());
  EXPECT_EQ(lb->strides, (Strides4{6 * kRow, kD, kRow, 1}));
  const Qkv s = split_qkv(empty({6, 2, kRow}, {.dtype = DType::bf16}));  // (S, B, kRow)
  const auto ls = in_place_layout(s.v, QkvFormat::sbhd);
  ASSERT_TRUE(ls.has_value());
  EXPECT_EQ(ls->strides, (Strides4{kRow, kD, 2 * kRow, 1}));
}

TEST(CudnnLayout, ViewsCuDnnCannotReadAreRefused) {
  const Tensor base = empty({10, kRow}, {.dtype = DType::bf16});
  // The head dim not innermost-contiguous: (T, H, D) with D strided.
  EXPECT_FALSE(in_place_layout(raw::transpose(raw::reshape(base, {10, kD, kRow / kD}), 1, 2), QkvFormat::thd));
  // A start 4 elements (8 bytes) into the row: not 16-byte aligned.
  const Tensor odd = raw::reshape(raw::narrow(base, 1, 4, kHq * kD), {10, kHq, kD});
  EXPECT_FALSE(in_place_layout(odd, QkvFormat::thd));
  // A row stride of 36 bf16 (72 bytes): not a multiple of 16 bytes.
  const Tensor narrow_rows = empty({10, 36}, {.dtype = DType::bf16});
  EXPECT_FALSE(in_place_layout(raw::reshape(raw::narrow(narrow_rows, 1, 0, 32), {10, 2, kD}), QkvFormat::thd));
  // The wrong rank for the format.
  EXPECT_FALSE(in_place_layout(empty({10, kHq, kD}, {.dtype = DType::bf16}), QkvFormat::bshd));
}

TEST(CudnnLayout, PackedGradientsMirrorTheProjection) {
  const Qkv t = split_qkv(empty({10, kRow}, {.dtype = DType::bf16}));
  const auto grads = packed_gradients(t.q, t.k, t.v);
  ASSERT_TRUE(grads.has_value());
  const auto& [dq, dk, dv] = *grads;
  EXPECT_EQ(dq.storage(), dk.storage());
  EXPECT_EQ(dq.storage(), dv.storage());
  EXPECT_NE(dq.storage(), t.q.storage());  // a fresh buffer, never the inputs'
  for (const auto& [g, x] : {std::pair{dq, t.q}, std::pair{dk, t.k}, std::pair{dv, t.v}}) {
    EXPECT_EQ(g.shape(), x.shape());
    EXPECT_EQ(g.strides(), x.strides());
    EXPECT_EQ(g.offset(), x.offset());
  }
  EXPECT_EQ(dq.storage()->nbytes(), t.packed.storage()->nbytes());
}

TEST(CudnnLayout, PackedGradientsOfTheFusedProjectionJoinWithoutACopy) {
  // The module's path end to end on the CPU: linear_cat's output split into heads, the gradients put
  // where packed_gradients says, split's backward handing on their buffer.
  const int64_t hidden = 32, tokens = 12;
  const nn::Linear q_proj({.in_features = hidden, .out_features = kHq * kD, .bias = false});
  const nn::Linear k_proj({.in_features = hidden, .out_features = kHkv * kD, .bias = false});
  const nn::Linear v_proj({.in_features = hidden, .out_features = kHkv * kD, .bias = false});
  const Tensor x = zeros({tokens, hidden});
  const Tensor qkv = linear_cat(x, {q_proj.weights_for(x), k_proj.weights_for(x), v_proj.weights_for(x)});
  const Qkv t = split_qkv(qkv);
  const auto grads = packed_gradients(t.q, t.k, t.v);
  ASSERT_TRUE(grads.has_value());
  // The same pieces seen as split's backward sees them: (T, width) views; adjacent in one buffer.
  const Tensor dq = nn::merge_heads((*grads)[0]), dv = nn::merge_heads((*grads)[2]);
  EXPECT_EQ(dq.storage(), dv.storage());
  EXPECT_EQ(dv.offset(), (kHq + kHkv) * kD);
  EXPECT_EQ(dq.stride(0), kRow);
}

TEST(CudnnLayout, OtherTensorsGetNoPackedGradients) {
  const Qkv t = split_qkv(empty({10, kRow}, {.dtype = DType::bf16}));
  EXPECT_FALSE(packed_gradients(t.k, t.q, t.v));              // out of order
  EXPECT_FALSE(packed_gradients(t.q, t.k, empty_like(t.v)));  // v is its own tensor (after a copy)
  // q, k, v cut from a buffer holding more than them (a row of 2 kRow): gradients would waste half.
  const Tensor wide = empty({10, 2 * kRow}, {.dtype = DType::bf16});
  const Qkv w = split_qkv(raw::narrow(wide, 1, 0, kRow));
  EXPECT_FALSE(packed_gradients(w.q, w.k, w.v));
  // One storage, the three dense one after another (not side by side per token).
  const Tensor flat = empty({10 * kRow}, {.dtype = DType::bf16});
  const Tensor q = raw::as_strided(flat, {10, kHq, kD}, {kHq * kD, kD, 1}, 0);
  const Tensor k = raw::as_strided(flat, {10, kHkv, kD}, {kHkv * kD, kD, 1}, 10 * kHq * kD);
  const Tensor v = raw::as_strided(flat, {10, kHkv, kD}, {kHkv * kD, kD, 1}, 10 * (kHq + kHkv) * kD);
  EXPECT_FALSE(packed_gradients(q, k, v));
}

}  // namespace
}  // namespace cpf::attention_cuda::cudnn
