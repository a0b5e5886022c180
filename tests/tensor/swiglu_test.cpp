// raw::swiglu / swiglu_backward on the CPU (framework/tensor/ops/swiglu.h): values against the unfused
// ops (silu then mul, and their gradients written out), column-slice views of one fused projection,
// the bf16 rounding (once, from the f32 value), empty tensors, and every rejected input.
#include <gtest/gtest.h>

#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/swiglu.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

Tensor silu_of(const Tensor& g) { return raw::unary(raw::UnaryOp::silu, g); }
Tensor sigmoid_of(const Tensor& g) { return raw::unary(raw::UnaryOp::sigmoid, g); }
Tensor mul(const Tensor& a, const Tensor& b) { return raw::binary(raw::BinaryOp::mul, a, b); }

TEST(Swiglu, EqualsSiluTimesUpInF64) {
  const Tensor g = random_tensor({3, 5, 7}, DType::f64, 1, -6, 6), u = random_tensor({3, 5, 7}, DType::f64, 2);
  EXPECT_TRUE(all_close(raw::swiglu(g, u), mul(silu_of(g), u), 1e-15, 1e-14));
}

TEST(Swiglu, BackwardEqualsTheChainRuleInF64) {
  const Tensor g = random_tensor({4, 9}, DType::f64, 3, -8, 8), u = random_tensor({4, 9}, DType::f64, 4);
  const Tensor dy = random_tensor({4, 9}, DType::f64, 5);
  const raw::SwigluGrads grads = raw::swiglu_backward(dy, g, u);
  // d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g)
  const Tensor s = sigmoid_of(g);
  const Tensor one_minus_s = raw::binary(raw::BinaryOp::sub, full_like(s, 1.0), s);
  const Tensor dsilu = mul(s, raw::binary(raw::BinaryOp::add, full_like(s, 1.0), mul(g, one_minus_s)));
  EXPECT_TRUE(all_close(grads.d_gate, mul(mul(dy, u), dsilu), 1e-15, 1e-13));
  EXPECT_TRUE(all_close(grads.d_up, mul(dy, silu_of(g)), 1e-15, 1e-14));
}

TEST(Swiglu, ColumnHalvesOfOneProjectionAndStridedGradients) {
  // gate | up as the two halves of a (N, 2I) GEMM output: row-strided views, read without a copy.
  const Tensor h = random_tensor({6, 16}, DType::f32, 6, -4, 4);
  const Tensor g = raw::narrow(h, 1, 0, 8), u = raw::narrow(h, 1, 8, 8);
  const Tensor gc = raw::contiguous(g), uc = raw::contiguous(u);
  EXPECT_TRUE(all_close(raw::swiglu(g, u), raw::swiglu(gc, uc), 0, 0));
  // A transposed (non-foldable) gradient is made contiguous first.
  const Tensor dy = raw::transpose(random_tensor({8, 6}, DType::f32, 7), 0, 1);
  const raw::SwigluGrads a = raw::swiglu_backward(dy, g, u), b = raw::swiglu_backward(raw::contiguous(dy), gc, uc);
  EXPECT_TRUE(all_close(a.d_gate, b.d_gate, 0, 0));
  EXPECT_TRUE(all_close(a.d_up, b.d_up, 0, 0));
  EXPECT_TRUE(a.d_gate.is_contiguous() && a.d_up.is_contiguous());
}

TEST(Swiglu, Bf16RoundsOnceFromTheF32Value) {
  const Tensor g = random_tensor({4, 32}, DType::f32, 8, -5, 5), u = random_tensor({4, 32}, DType::f32, 9);
  const Tensor gb = raw::to(g, DType::bf16), ub = raw::to(u, DType::bf16);
  const Tensor expected = raw::to(raw::swiglu(raw::to(gb, DType::f32), raw::to(ub, DType::f32)), DType::bf16);
  const Tensor y = raw::swiglu(gb, ub);
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(y, expected, 0, 0));
  const Tensor dy = raw::to(random_tensor({4, 32}, DType::f32, 10), DType::bf16);
  const raw::SwigluGrads b = raw::swiglu_backward(dy, gb, ub);
  const raw::SwigluGrads f =
      raw::swiglu_backward(raw::to(dy, DType::f32), raw::to(gb, DType::f32), raw::to(ub, DType::f32));
  EXPECT_TRUE(all_close(b.d_gate, raw::to(f.d_gate, DType::bf16), 0, 0));
  EXPECT_TRUE(all_close(b.d_up, raw::to(f.d_up, DType::bf16), 0, 0));
}

TEST(Swiglu, EmptyAndOneDimInputs) {
  const Tensor e = zeros({0, 4});
  EXPECT_EQ(raw::swiglu(e, e).shape(), (Shape{0, 4}));
  EXPECT_EQ(raw::swiglu_backward(e, e, e).d_up.shape(), (Shape{0, 4}));
  const Tensor g = random_tensor({5}, DType::f64, 11), u = random_tensor({5}, DType::f64, 12);
  EXPECT_TRUE(all_close(raw::swiglu(g, u), mul(silu_of(g), u), 1e-15, 1e-14));
}

TEST(Swiglu, BackwardIntoTheHalvesOfOneGradient) {
  // The packed form's backward: d_gate and d_up written into the two halves of one (N, 2I) buffer.
  const Tensor h = random_tensor({5, 12}, DType::f64, 13), dy = random_tensor({5, 6}, DType::f64, 14);
  const Tensor g = raw::narrow(h, 1, 0, 6), u = raw::narrow(h, 1, 6, 6);
  const Tensor dh = zeros({5, 12}, {.dtype = DType::f64});
  raw::swiglu_backward_into(dy, g, u, raw::narrow(dh, 1, 0, 6), raw::narrow(dh, 1, 6, 6));
  const raw::SwigluGrads ref = raw::swiglu_backward(dy, g, u);
  EXPECT_TRUE(all_close(raw::narrow(dh, 1, 0, 6), ref.d_gate, 0, 0));
  EXPECT_TRUE(all_close(raw::narrow(dh, 1, 6, 6), ref.d_up, 0, 0));
}

TEST(Swiglu, RejectsBadInputs) {
  const Tensor a = zeros({2, 3});
  EXPECT_CPF_ERROR(raw::swiglu(Tensor(), a), "swiglu: argument 'gate'");
  EXPECT_CPF_ERROR(raw::swiglu(a, Tensor()), "swiglu: argument 'up'");
  EXPECT_CPF_ERROR(raw::swiglu(a, zeros({3, 2})), "gate and up must have the same shape: gate=[2,3] up=[3,2]");
  EXPECT_CPF_ERROR(raw::swiglu(zeros({}), zeros({})), "at least one dim");
  EXPECT_CPF_ERROR(raw::swiglu(a, zeros({2, 3}, {.dtype = DType::f64})), "same dtype: gate=f32 up=f64");
  EXPECT_CPF_ERROR(raw::swiglu(zeros({2, 3}, {.dtype = DType::i64}), zeros({2, 3}, {.dtype = DType::i64})),
                   "must be f32, f64 or bf16, got i64");
  EXPECT_CPF_ERROR(raw::swiglu_backward(zeros({2, 2}), a, a), "grad_out must have gate's shape, dtype and device");
  EXPECT_CPF_ERROR(raw::swiglu_backward(zeros({2, 3}, {.dtype = DType::f64}), a, a),
                   "grad_out [2,3] f64 on cpu, gate [2,3] f32");
  EXPECT_CPF_ERROR(raw::swiglu_backward(Tensor(), a, a), "swiglu_backward: argument 'grad_out'");
  EXPECT_CPF_ERROR(raw::swiglu_backward(a, a, zeros({3})), "swiglu_backward: gate and up must have the same shape");
  const Tensor out = zeros({2, 3});
  EXPECT_CPF_ERROR(raw::swiglu_backward_into(a, a, a, Tensor(), out), "swiglu_backward: argument 'd_gate'");
  EXPECT_CPF_ERROR(raw::swiglu_backward_into(a, a, a, out, zeros({3, 2})),
                   "d_up must have gate's shape [2,3], dtype f32 and device cpu");
  EXPECT_CPF_ERROR(raw::swiglu_backward_into(a, a, a, raw::transpose(zeros({3, 2}), 0, 1), out),
                   "d_gate must have gate's shape [2,3], dtype f32 and device cpu with unit stride along the last dim "
                   "and one stride between rows: got [2,3] f32 on cpu strides [1,2]");
}

}  // namespace
}  // namespace cpf
