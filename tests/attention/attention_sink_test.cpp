// Attention sinks (spec.sink, attention_sink.h) on the CPU: out, lse, dq, dk, dv and d(sink) against
// a naive oracle that puts the sink in the softmax as one more column, every format with GQA/MQA,
// windows, padded storage and a sequence without keys; the f64 finite-difference gradcheck through
// the sink; the rejected sinks and their messages.
#include <gtest/gtest.h>

#include <limits>

#include "attention/attention_sink.h"
#include "framework/tensor/ops/elementwise.h"
#include "support/gradcheck_utils.h"
#include "tests/attention/attention_support.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

struct SinkRun {
  Tensor out, lse, dq, dk, dv, dsink;
};

template <class Fn>
SinkRun run_with_sink(Fn&& fn, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sink,
                      const Tensor& dout, const Tensor& dlse) {
  Tensor lq = raw::clone(q).set_requires_grad(true), lk = raw::clone(k).set_requires_grad(true);
  Tensor lv = raw::clone(v).set_requires_grad(true), ls = raw::clone(sink).set_requires_grad(true);
  auto [out, lse] = fn(lq, lk, lv, ls);
  backward(std::vector<Tensor>{out, lse}, std::vector<Tensor>{dout, raw::to(dlse, lse.dtype())});
  return {out.detach(), lse.detach(), lq.grad(), lk.grad(), lv.grad(), ls.grad()};
}

// The kernels with the sink against the naive oracle, values and every gradient.
void expect_sink_matches_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sink,
                                   AttentionSpec spec, const std::optional<SequenceInfo>& seq, double tol = 1e-10) {
  spec.sink = sink;
  const AttentionOutput probe = dot_product_attention(q, k, v, spec, seq);
  const Tensor dout = random_tensor(probe.out.shape(), q.dtype(), 201);
  const Tensor dlse = random_tensor(probe.lse.shape(), probe.lse.dtype(), 202);
  const SinkRun got = run_with_sink(
      [&](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& s) {
        AttentionSpec with = spec;
        with.sink = s;
        auto r = dot_product_attention(a, b, c, with, seq, {.block_q = 3, .block_kv = 2});
        return std::pair{r.out, r.lse};
      },
      q, k, v, sink, dout, dlse);
  const SinkRun want = run_with_sink(
      [&](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& s) {
        auto r = testing::naive_attention_with_sink(a, b, c, spec, seq, s);
        return std::pair{r.out, r.lse};
      },
      q, k, v, sink, dout, dlse);
  EXPECT_TRUE(all_close(got.out, want.out, tol, tol)) << "out, " << spec.str();
  EXPECT_TRUE(all_close(got.lse, want.lse, tol, tol)) << "lse, " << spec.str();
  EXPECT_TRUE(all_close(got.dq, want.dq, tol, tol)) << "dq, " << spec.str();
  EXPECT_TRUE(all_close(got.dk, want.dk, tol, tol)) << "dk, " << spec.str();
  EXPECT_TRUE(all_close(got.dv, want.dv, tol, tol)) << "dv, " << spec.str();
  EXPECT_TRUE(all_close(got.dsink, want.dsink, tol, tol)) << "dsink, " << spec.str();
}

TEST(AttentionSink, BshdCausalGqaMatchesOracle) {
  const Tensor q = random_tensor({2, 7, 4, 5}, DType::f64, 1), k = random_tensor({2, 7, 2, 5}, DType::f64, 2);
  const Tensor v = random_tensor({2, 7, 2, 3}, DType::f64, 3), sink = random_tensor({4}, DType::f64, 4, -2, 2);
  expect_sink_matches_reference(q, k, v, sink, {.qkv_format = QkvFormat::bshd, .mask = MaskType::causal}, std::nullopt);
}

TEST(AttentionSink, SbhdSlidingWindowMqaMatchesOracle) {
  const Tensor q = random_tensor({9, 2, 3, 4}, DType::f64, 5), k = random_tensor({9, 2, 1, 4}, DType::f64, 6);
  const Tensor v = random_tensor({9, 2, 1, 4}, DType::f64, 7), sink = random_tensor({3}, DType::f64, 8, -2, 2);
  expect_sink_matches_reference(q, k, v, sink, {.qkv_format = QkvFormat::sbhd, .window = {2, 1}, .softmax_scale = 0.6},
                                std::nullopt);
}

TEST(AttentionSink, ThdPaddedStorageAndEmptySequenceKeepMinusInfinity) {
  // Lengths 3, 0, 1, 4 in slots of 4, 2, 1, 5: padded storage stays out = 0, lse = -inf.
  const SequenceInfo seq = SequenceInfo::from_cu_seqlens({0, 3, 3, 4, 8}, {0, 4, 6, 7, 12});
  const Tensor q = random_tensor({12, 2, 3}, DType::f64, 9), k = random_tensor({12, 1, 3}, DType::f64, 10);
  const Tensor v = random_tensor({12, 1, 2}, DType::f64, 11), sink = random_tensor({2}, DType::f64, 12, -2, 2);
  const AttentionSpec spec{.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal};
  expect_sink_matches_reference(q, k, v, sink, spec, seq);
  AttentionSpec with = spec;
  with.sink = sink;
  const AttentionOutput r = dot_product_attention(q, k, v, with, seq);
  const std::vector<double> lse = r.lse.to_vector<double>();
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(lse[h * 12 + 3], -std::numeric_limits<double>::infinity()) << "padded token 3, head " << h;
    EXPECT_EQ(lse[h * 12 + 11], -std::numeric_limits<double>::infinity()) << "padded token 11, head " << h;
  }
}

TEST(AttentionSink, CrossAttentionWithFullyMaskedRowsMatchesOracle) {
  // Row 1's queries see only 1 key and sit 2 positions ahead: some rows see none under the window.
  const SequenceInfo seq = SequenceInfo::from_lengths({3, 4}, {5, 1}, 4, 6).with_position_offsets(2, 0);
  const Tensor q = random_tensor({2, 4, 2, 3}, DType::f64, 13), k = random_tensor({2, 6, 2, 3}, DType::f64, 14);
  const Tensor v = random_tensor({2, 6, 2, 3}, DType::f64, 15), sink = random_tensor({2}, DType::f64, 16, -2, 2);
  expect_sink_matches_reference(
      q, k, v, sink, {.qkv_format = QkvFormat::bshd, .mask = MaskType::padding_causal, .window = {1, 0}}, seq);
}

TEST(AttentionSink, F32MatchesOracle) {
  const Tensor q = random_tensor({1, 16, 4, 8}, DType::f32, 17), k = random_tensor({1, 16, 4, 8}, DType::f32, 18);
  const Tensor v = random_tensor({1, 16, 4, 8}, DType::f32, 19), sink = random_tensor({4}, DType::f32, 20, -2, 2);
  expect_sink_matches_reference(q, k, v, sink, {.mask = MaskType::causal}, std::nullopt, 2e-5);
}

TEST(AttentionSink, VeryNegativeSinkEqualsNoSinkAndLargeSinkTakesTheWeight) {
  const Tensor q = random_tensor({1, 6, 2, 4}, DType::f64, 21), k = random_tensor({1, 6, 2, 4}, DType::f64, 22);
  const Tensor v = random_tensor({1, 6, 2, 4}, DType::f64, 23);
  const AttentionSpec plain{.mask = MaskType::causal};
  const AttentionOutput without = dot_product_attention(q, k, v, plain);
  AttentionSpec with = plain;
  with.sink = full({2}, -1e4, {.dtype = DType::f64});
  const AttentionOutput negligible = dot_product_attention(q, k, v, with);
  EXPECT_TRUE(all_close(negligible.out, without.out, 0, 0));
  EXPECT_TRUE(all_close(negligible.lse, without.lse, 0, 0));
  // A sink far above every score takes (almost) all the weight: out -> 0, lse -> sink.
  with.sink = full({2}, 60.0, {.dtype = DType::f64});
  const AttentionOutput dominant = dot_product_attention(q, k, v, with);
  EXPECT_TRUE(all_close(dominant.out, zeros_like(without.out), 1e-20, 0));
  EXPECT_TRUE(all_close(dominant.lse, full(without.lse.shape(), 60.0, {.dtype = DType::f64}), 1e-12, 0));
}

// f64 finite differences through out and lse, with respect to q, k, v and the sink.
GradcheckFn sink_fn(const AttentionSpec& spec, const std::optional<SequenceInfo>& seq) {
  return [=](const std::vector<Tensor>& x) {
    AttentionSpec with = spec;
    with.sink = x[3];
    const AttentionOutput r = dot_product_attention(x[0], x[1], x[2], with, seq, {.block_q = 2, .block_kv = 3});
    const Tensor finite = raw::compare(raw::CompareOp::gt, r.lse.detach(), -std::numeric_limits<double>::infinity());
    return std::vector<Tensor>{r.out, where(finite, r.lse, zeros({}, {.dtype = DType::f64}))};
  };
}

TEST(AttentionSinkGradcheck, BshdCausalGqa) {
  using testing::grad_input;
  EXPECT_GRADCHECK(sink_fn({.qkv_format = QkvFormat::bshd, .mask = MaskType::causal}, std::nullopt),
                   (std::vector<Tensor>{grad_input({2, 5, 4, 3}, 1), grad_input({2, 5, 2, 3}, 2),
                                        grad_input({2, 5, 2, 2}, 3), grad_input({4}, 4)}));
}

TEST(AttentionSinkGradcheck, ThdPaddedWindow) {
  using testing::grad_input;
  const SequenceInfo seq = SequenceInfo::from_cu_seqlens({0, 3, 4, 4, 6}, {0, 4, 6, 7, 9});
  EXPECT_GRADCHECK(sink_fn({.qkv_format = QkvFormat::thd, .mask = MaskType::padding_causal, .window = {1, 0}}, seq),
                   (std::vector<Tensor>{grad_input({9, 2, 3}, 5), grad_input({9, 1, 3}, 6), grad_input({9, 1, 2}, 7),
                                        grad_input({2}, 8)}));
}

TEST(AttentionSinkValidation, RejectsWrongShapeAndDtype) {
  const Tensor q = random_tensor({1, 4, 2, 4}, DType::f32, 1), k = random_tensor({1, 4, 2, 4}, DType::f32, 2);
  const Tensor v = random_tensor({1, 4, 2, 4}, DType::f32, 3);
  AttentionSpec spec;
  spec.sink = zeros({3}, {.dtype = DType::f32});
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, spec),
                   "the attention sink must hold one logit per query head, shape [2]: sink=[3]");
  spec.sink = zeros({1, 2}, {.dtype = DType::f32});
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, spec), "one logit per query head, shape [2]: sink=[1,2]");
  spec.sink = zeros({2}, {.dtype = DType::bf16});
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, spec),
                   "the attention sink must be f32 (f64 only with f64 inputs): sink is bf16 with f32 inputs");
  spec.sink = zeros({2}, {.dtype = DType::f64});
  EXPECT_CPF_ERROR(dot_product_attention(q, k, v, spec), "sink is f64 with f32 inputs");
}

}  // namespace
}  // namespace cpf
