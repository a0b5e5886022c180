// decode_attention (attention/decode_attention.h) on the CPU: the new token of each sequence attends to
// its cache slot exactly as dot_product_attention's thd call over the KV cache step does (f64, to 1e-12),
// with GQA, sliding windows, sinks and unequal lengths; an empty slot gives zeros; bad inputs are refused
// with their values named.
#include "attention/decode_attention.h"

#include <gtest/gtest.h>

#include "attention/dot_product_attention.h"
#include "attention/nn/kv_cache.h"
#include "framework/autograd/grad_mode.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

struct Shapes {
  int64_t heads = 4, kv_heads = 2, dim_qk = 8, dim_v = 6, capacity = 7;
};

// The reference: dot_product_attention over the cache step with past = len - 1 and one new token.
Tensor through_full_attention(const Tensor& q, const Tensor& keys, const Tensor& values,
                              const std::vector<int64_t>& lengths, const AttentionSpec& spec, int64_t capacity) {
  nn::KVCacheStep step{.capacity = capacity, .past = {}, .new_tokens = {}};
  for (int64_t len : lengths) {
    step.past.push_back(len - 1);
    step.new_tokens.push_back(1);
  }
  return dot_product_attention(q, keys, values, spec, step.attention_info()).out;
}

void expect_matches_full_attention(const Shapes& s, const std::vector<int64_t>& lengths, AttentionSpec spec) {
  const auto seqs = static_cast<int64_t>(lengths.size());
  const Tensor q = random_tensor({seqs, s.heads, s.dim_qk}, DType::f64, 11, -2, 2);
  const Tensor keys = random_tensor({seqs * s.capacity, s.kv_heads, s.dim_qk}, DType::f64, 12, -2, 2);
  const Tensor values = random_tensor({seqs * s.capacity, s.kv_heads, s.dim_v}, DType::f64, 13);
  const Tensor out = decode_attention(q, keys, values, from_vector(lengths, {seqs}), spec);
  EXPECT_EQ(out.shape(), (Shape{seqs, s.heads, s.dim_v}));
  EXPECT_TRUE(all_close(out, through_full_attention(q, keys, values, lengths, spec, s.capacity), 1e-12, 1e-12))
      << spec.str();
}

AttentionSpec causal() { return {.qkv_format = QkvFormat::thd, .mask = MaskType::causal}; }

TEST(DecodeAttention, MatchesTheFullAttentionOfTheNewTokens) {
  NoGradGuard no_grad;
  expect_matches_full_attention({}, {3, 1, 7}, causal());
  expect_matches_full_attention({.heads = 3, .kv_heads = 3, .dim_qk = 5, .dim_v = 5, .capacity = 9}, {9, 4}, causal());
  expect_matches_full_attention({.heads = 4, .kv_heads = 1}, {6}, causal());  // MQA
  AttentionSpec window = causal();
  window.window = {2, 0};  // the query and the two keys before it
  expect_matches_full_attention({}, {7, 2, 5}, window);
  AttentionSpec scaled = causal();
  scaled.softmax_scale = 0.7;
  expect_matches_full_attention({}, {4, 5}, scaled);
  AttentionSpec sink = causal();
  sink.sink = from_vector<double>({0.5, -1.0, 2.0, 0.0}, {4});
  expect_matches_full_attention({}, {3, 7, 1}, sink);
}

TEST(DecodeAttention, AnEmptySlotGivesZerosAndBf16RoundsOnce) {
  NoGradGuard no_grad;
  const Shapes s;
  const Tensor q = random_tensor({2, s.heads, s.dim_qk}, DType::f64, 21);
  const Tensor keys = random_tensor({2 * s.capacity, s.kv_heads, s.dim_qk}, DType::f64, 22);
  const Tensor values = random_tensor({2 * s.capacity, s.kv_heads, s.dim_v}, DType::f64, 23);
  AttentionSpec spec = causal();
  spec.sink = from_vector<double>({1.0, 1.0, 1.0, 1.0}, {4});
  const Tensor out = decode_attention(q, keys, values, from_vector<int64_t>({0, 3}, {2}), spec);
  EXPECT_TRUE(all_close(raw::select(out, 0, 0), zeros({s.heads, s.dim_v}, {.dtype = DType::f64}), 0, 0));
  // bf16 inputs: the f64 result of the same (bf16) numbers, rounded once.
  const Tensor qb = raw::to(q, DType::bf16), kb = raw::to(keys, DType::bf16), vb = raw::to(values, DType::bf16);
  const Tensor lengths = from_vector<int32_t>({5, 3}, {2});
  const Tensor got = decode_attention(qb, kb, vb, lengths, causal());
  EXPECT_EQ(got.dtype(), DType::bf16);
  const Tensor want =
      decode_attention(raw::to(qb, DType::f64), raw::to(kb, DType::f64), raw::to(vb, DType::f64), lengths, causal());
  EXPECT_TRUE(all_close(raw::to(got, DType::f64), raw::to(raw::to(want, DType::bf16), DType::f64), 0, 0));
}

// decode_attention_append stores the new rows at n * capacity + len_n - 1 and attends as decode_attention
// over the stored cache; strided views (a fused QKV projection's q, k, v) are taken as they are.
TEST(DecodeAttention, AppendStoresTheNewRowsThenAttends) {
  NoGradGuard no_grad;
  const Shapes s;
  const Tensor qkv = random_tensor({3, s.heads + 2 * s.kv_heads, s.dim_qk}, DType::f64, 41, -2, 2);
  const Tensor q = raw::narrow(qkv, 1, 0, s.heads);  // strided views of one buffer
  const Tensor k_new = raw::narrow(qkv, 1, s.heads, s.kv_heads);
  const Tensor v_new = raw::narrow(qkv, 1, s.heads + s.kv_heads, s.kv_heads);
  Tensor keys = random_tensor({3 * s.capacity, s.kv_heads, s.dim_qk}, DType::f64, 42);
  Tensor values = random_tensor({3 * s.capacity, s.kv_heads, s.dim_qk}, DType::f64, 43);
  Tensor want_keys = raw::clone(keys), want_values = raw::clone(values);
  const std::vector<int64_t> lengths{4, 0, 7};
  for (int64_t n : {0, 2}) {
    const int64_t row = n * s.capacity + lengths[static_cast<size_t>(n)] - 1;
    raw::copy_(raw::narrow(want_keys, 0, row, 1), raw::narrow(k_new, 0, n, 1));
    raw::copy_(raw::narrow(want_values, 0, row, 1), raw::narrow(v_new, 0, n, 1));
  }
  const Tensor lens = from_vector(lengths, {3});
  const Tensor want = decode_attention(raw::contiguous(q), want_keys, want_values, lens, causal());
  const Tensor got = decode_attention_append(q, k_new, v_new, keys, values, lens, causal());
  EXPECT_TRUE(all_close(keys, want_keys, 0, 0));
  EXPECT_TRUE(all_close(values, want_values, 0, 0));
  EXPECT_TRUE(all_close(got, want, 1e-14, 1e-14));
  EXPECT_CPF_ERROR(decode_attention_append(q, raw::narrow(k_new, 0, 0, 2), v_new, keys, values, lens, causal()),
                   "decode_attention_append: k_new (S, H_kv, D_qk) = (3, 2, 8) and v_new (S, H_kv, D_v) expected");
}

TEST(DecodeAttention, RefusesInputsItCannotComputeExactly) {
  const Shapes s;
  const Tensor q = random_tensor({2, s.heads, s.dim_qk}, DType::f64, 31);
  const Tensor keys = random_tensor({2 * s.capacity, s.kv_heads, s.dim_qk}, DType::f64, 32);
  const Tensor values = random_tensor({2 * s.capacity, s.kv_heads, s.dim_v}, DType::f64, 33);
  const Tensor lengths = from_vector<int64_t>({2, 3}, {2});
  {
    NoGradGuard no_grad;
    EXPECT_CPF_ERROR(decode_attention(q, keys, values, from_vector<int64_t>({2, 8}, {2}), causal()),
                     "decode_attention: lengths[1] = 8 is outside the slot's 0 .. capacity=7 tokens");
    EXPECT_CPF_ERROR(decode_attention(q, keys, values, from_vector<int64_t>({2}, {1}), causal()),
                     "decode_attention: lengths must be (S) = (2) i32 or i64, got [1] i64");
    EXPECT_CPF_ERROR(decode_attention(q, keys, values, lengths, {.qkv_format = QkvFormat::thd}),
                     "decode_attention: decoding needs the thd format with a causal mask");
    EXPECT_CPF_ERROR(decode_attention(q, raw::narrow(keys, 0, 0, 13), raw::narrow(values, 0, 0, 13), lengths, causal()),
                     "decode_attention: shapes do not fit");
    EXPECT_CPF_ERROR(decode_attention(raw::to(q, DType::f32), keys, values, lengths, causal()),
                     "decode_attention: q, keys and values must share one floating dtype, got f32, f64, f64");
    AttentionSpec heads = causal();
    heads.num_heads = 8;
    EXPECT_CPF_ERROR(decode_attention(q, keys, values, lengths, heads),
                     "decode_attention: the spec names 8 / 0 heads, the tensors have 4 / 2");
  }
  const Tensor leaf = random_tensor({2, s.heads, s.dim_qk}, DType::f64, 34).set_requires_grad(true);
  EXPECT_CPF_ERROR(decode_attention(leaf, keys, values, lengths, causal()),
                   "decode_attention is not differentiable: run it under NoGradGuard");
}

}  // namespace
}  // namespace cpf
