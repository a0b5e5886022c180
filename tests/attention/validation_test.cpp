// Every input dot_product_attention and the raw kernels reject, with the message checked.
#include <gtest/gtest.h>

#include "attention/dot_product_attention.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::random_tensor;

Tensor t(const Shape& shape, DType dtype = DType::f32) { return random_tensor(shape, dtype, 1); }

const AttentionSpec kBshd{.qkv_format = QkvFormat::bshd};
const AttentionSpec kThd{.qkv_format = QkvFormat::thd, .mask = MaskType::padding};

TEST(AttentionValidation, TensorsMustAgree) {
  EXPECT_CPF_ERROR(dot_product_attention(Tensor(), t({1, 4, 2, 8}), t({1, 4, 2, 8}), kBshd),
                   "q, k and v must all be defined (q undefined, k defined, v defined)");
  EXPECT_CPF_ERROR(dot_product_attention(t({1, 4, 2, 8}), t({1, 4, 2, 8}, DType::f64), t({1, 4, 2, 8}), kBshd),
                   "Q, K and V must have the same dtype: q=f32 k=f64 v=f32");
  EXPECT_CPF_ERROR(
      dot_product_attention(zeros({1, 4, 2, 8}, {.dtype = DType::i64}), zeros({1, 4, 2, 8}, {.dtype = DType::i64}),
                            zeros({1, 4, 2, 8}, {.dtype = DType::i64}), kBshd),
      "Q, K and V must be f32, f64 or bf16: dtype=i64");
  EXPECT_CPF_ERROR(dot_product_attention(t({4, 2, 8}), t({4, 2, 8}), t({4, 2, 8}), kBshd),
                   "qkv_format bshd expects (batch, seq, heads, dim) tensors: q=[4,2,8] k=[4,2,8] v=[4,2,8]");
  EXPECT_CPF_ERROR(dot_product_attention(t({1, 4, 2, 8}), t({1, 4, 2, 8}), t({1, 4, 2, 8}), kThd),
                   "qkv_format thd expects (tokens, heads, dim) tensors");
  EXPECT_CPF_ERROR(dot_product_attention(t({2, 4, 2, 8}), t({1, 4, 2, 8}), t({1, 4, 2, 8}), kBshd),
                   "Q, K and V must have the same batch size: q=[2,4,2,8] k=[1,4,2,8] v=[1,4,2,8]");
  EXPECT_CPF_ERROR(
      dot_product_attention(t({4, 2, 2, 8}), t({4, 2, 2, 8}), t({4, 1, 2, 8}), {.qkv_format = QkvFormat::sbhd}),
      "Q, K and V must have the same batch size: q=[4,2,2,8] k=[4,2,2,8] v=[4,1,2,8]");
  EXPECT_CPF_ERROR(dot_product_attention(t({1, 4, 2, 8}), t({1, 4, 2, 8}), t({1, 6, 2, 8}), kBshd),
                   "K and V must have the same sequence length: q=[1,4,2,8] k=[1,4,2,8] v=[1,6,2,8]");
  EXPECT_CPF_ERROR(dot_product_attention(t({1, 4, 4, 8}), t({1, 4, 2, 8}), t({1, 4, 1, 8}), kBshd),
                   "K and V must have the same number of heads: k=[1,4,2,8] v=[1,4,1,8]");
  EXPECT_CPF_ERROR(dot_product_attention(t({1, 4, 6, 8}), t({1, 4, 4, 8}), t({1, 4, 4, 8}), kBshd),
                   "the query heads must be a multiple of the key/value heads (GQA/MQA): h_q=6 h_kv=4");
  EXPECT_CPF_ERROR(dot_product_attention(t({1, 4, 2, 8}), t({1, 4, 2, 6}), t({1, 4, 2, 6}), kBshd),
                   "Q and K must have the same head dim (d_qk): q=[1,4,2,8] k=[1,4,2,6]");
}

TEST(AttentionValidation, SpecShapesMustMatchTheTensors) {
  const Tensor q = t({1, 4, 4, 8}), k = t({1, 4, 2, 8}), v = t({1, 4, 2, 6});
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, {.num_heads = 8}), "spec num_heads=8 but q has 4 heads");
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, {.num_kv_heads = 1}), "spec num_kv_heads=1 but k has 2 heads");
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, {.head_dim_qk = 16}), "spec head_dim_qk=16 but q has head dim 8");
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, {.head_dim_v = 8}), "spec head_dim_v=8 but v has head dim 6");
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, {.mask = MaskType::causal, .window = {2, 3}}),
                   "mask causal sees no keys after the query, so the window must have right = 0 or -1: window=[2, 3]");
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, {}, std::nullopt, {.block_q = 0}),
                   "tile sizes must be positive: block_q=0 block_kv=64");
}

TEST(AttentionValidation, SequenceInfoIsRequiredAndMustFit) {
  EXPECT_CPF_ERROR(dot_product_attention(t({6, 2, 8}), t({6, 2, 8}), t({6, 2, 8}), kThd),
                   "qkv_format thd needs a SequenceInfo (cu_seqlens) to find its sequences");
  EXPECT_CPF_ERROR(
      dot_product_attention(t({1, 4, 2, 8}), t({1, 4, 2, 8}), t({1, 4, 2, 8}), {.mask = MaskType::padding_causal}),
      "mask padding_causal needs a SequenceInfo with the real lengths");
  EXPECT_CPF_ERROR(dot_product_attention(t({6, 2, 8}), t({6, 2, 8}), t({6, 2, 8}), kThd,
                                         SequenceInfo::from_cu_seqlens({0, 3, 5}, {0, 4, 8})),
                   "the sequences need 8 q and 8 kv tokens of storage but q has 6 and k 6");
  // bshd: packed lengths instead of one sequence per row.
  EXPECT_CPF_ERROR(dot_product_attention(t({2, 4, 2, 8}), t({2, 4, 2, 8}), t({2, 4, 2, 8}), {.mask = MaskType::padding},
                                         SequenceInfo::from_lengths({3, 4})),
                   "the sequences of a bshd call must cover batch x seq tokens (8 q, 8 kv) but cover 7 q and 7 kv");
  SequenceInfo crossing = SequenceInfo::from_cu_seqlens({0, 2, 5}, {0, 2, 8});
  EXPECT_CPF_ERROR(
      dot_product_attention(t({2, 4, 2, 8}), t({2, 4, 2, 8}), t({2, 4, 2, 8}), {.mask = MaskType::padding}, crossing),
      "sequence 1 crosses a batch row: q tokens [2, 5), kv tokens [2, 5) with rows of 4 q and 4 kv");
  const SequenceInfo rows = SequenceInfo::from_cu_seqlens({0, 2, 4}, {0, 2, 4}, {0, 4, 8}, {0, 2, 8});
  EXPECT_CPF_ERROR(
      dot_product_attention(t({2, 4, 2, 8}), t({2, 4, 2, 8}), t({2, 4, 2, 8}), {.mask = MaskType::padding}, rows),
      "sequence 1 has its queries in batch row 1 but its keys in row 0");
  EXPECT_CPF_ERROR(dot_product_attention(t({2, 4, 2, 8}), t({2, 4, 2, 8}), t({2, 4, 2, 8}), {.mask = MaskType::causal},
                                         SequenceInfo::from_lengths({4, 3}, 4)),
                   "mask causal treats every bshd row as one whole sequence, but sequence 1 has 3 q and 3 kv tokens");
}

TEST(AttentionValidation, BackwardInputsMustMatchTheForward) {
  const Tensor q = t({1, 4, 2, 8}), out = t({1, 4, 2, 8}), lse = t({1, 2, 4});
  EXPECT_CPF_ERROR(raw::attention_backward(t({1, 4, 2, 6}), Tensor(), q, q, q, out, lse, kBshd),
                   "dout must have the attention output's shape [1,4,2,8]: dout=[1,4,2,6]");
  EXPECT_CPF_ERROR(raw::attention_backward(out, Tensor(), q, q, q, out, t({1, 4, 2}), kBshd),
                   "lse must have the log-sum-exp's shape [1,2,4]: lse=[1,4,2]");
  EXPECT_CPF_ERROR(raw::attention_backward(out, t({2, 4}), q, q, q, out, lse, kBshd),
                   "dlse must have the log-sum-exp's shape [1,2,4]: dlse=[2,4]");
  EXPECT_CPF_ERROR(raw::attention_backward(out, Tensor(), q, q, q, Tensor(), lse, kBshd), "out is undefined");
  EXPECT_CPF_ERROR(
      raw::attention_backward(zeros({1, 4, 2, 8}, {.dtype = DType::i32}), Tensor(), q, q, q, out, lse, kBshd),
      "dout must be a floating-point tensor on q's device cpu: i32 on cpu");
}

}  // namespace
}  // namespace cpf
