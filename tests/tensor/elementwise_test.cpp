// Element-wise kernels (framework/tensor/ops/elementwise.h) against naive loops over std::vector
// (elementwise_reference.h): every unary and binary op, broadcasting in every position, non-contiguous
// inputs, the OpenMP path, bf16 and integer dtypes, and every error message. Compare, where and the
// in-place ops: elementwise_compare_test.cpp.
#include "framework/tensor/ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "support/host_as_device.h"
#include "support/test_utils.h"
#include "tests/tensor/elementwise_reference.h"

namespace cpf {
namespace {

using namespace testing;  // the references (elementwise_reference.h), all_close, random_tensor

// ---- unary ----

TEST(Unary, EveryOpMatchesTheReference) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (UnaryOp op : kUnaryOps) {
      SCOPED_TRACE(std::string(raw::op_name(op)) + " " + dtype_name(dtype));
      Tensor x =
          positive_domain(op) ? random_tensor({7, 9}, dtype, 3, 0.1, 4.0) : random_tensor({7, 9}, dtype, 3, -4, 4);
      Tensor y = raw::unary(op, x);
      EXPECT_EQ(y.dtype(), dtype);
      EXPECT_EQ(y.shape(), x.shape());
      std::vector<double> expected;
      for (double v : x.to_vector<double>()) expected.push_back(ref_unary(op, v));
      EXPECT_TRUE(all_close(y, as_f64(expected, x.shape()), tol(dtype), tol(dtype)));
    }
  }
}

TEST(Unary, NonContiguousAndLargeInputs) {
  // Transposed, stepped and expanded views, and 1<<17 elements so the loop runs on OpenMP threads.
  Tensor base = random_tensor({300, 440}, DType::f32, 4, -3, 3);
  const std::vector<Tensor> inputs{raw::transpose(base, 0, 1), raw::slice(base, 1, 1, 440, 3),
                                   raw::expand(raw::select(base, 0, 5), {3, 440}), base};
  for (const Tensor& x : inputs) {
    for (UnaryOp op : {UnaryOp::tanh, UnaryOp::gelu, UnaryOp::abs, UnaryOp::exp}) {
      Tensor y = raw::unary(op, x);
      EXPECT_TRUE(y.is_contiguous());
      std::vector<double> expected;
      for (double v : x.to_vector<double>()) expected.push_back(ref_unary(op, v));
      EXPECT_TRUE(all_close(y, as_f64(expected, x.shape()), 1e-5, 2e-6)) << raw::op_name(op);
    }
  }
}

TEST(Unary, SpecialValues) {
  Tensor x = from_vector<double>({0.0, -0.0, INFINITY, -INFINITY, NAN, -1.0}, {6});
  const auto e = raw::exp(x).to_vector<double>();
  EXPECT_EQ(e[2], INFINITY);
  EXPECT_EQ(e[3], 0.0);
  EXPECT_TRUE(std::isnan(e[4]));
  const auto l = raw::log(x).to_vector<double>();
  EXPECT_EQ(l[0], -INFINITY);
  EXPECT_TRUE(std::isnan(l[5]));
  const auto s = raw::unary(UnaryOp::sigmoid, x).to_vector<double>();
  EXPECT_EQ(s[2], 1.0);
  EXPECT_EQ(s[3], 0.0);
  const auto r = raw::unary(UnaryOp::relu, x).to_vector<double>();
  EXPECT_EQ(r[5], 0.0);
  EXPECT_EQ(r[2], INFINITY);
}

TEST(Unary, IntegerOps) {
  for (DType dtype : {DType::i32, DType::i64}) {
    Tensor x = raw::to(from_vector<int64_t>({-3, 0, 5, -7, 1000}, {5}), dtype);
    EXPECT_EQ(raw::neg(x).to_vector<int64_t>(), (std::vector<int64_t>{3, 0, -5, 7, -1000}));
    EXPECT_EQ(raw::unary(UnaryOp::abs, x).to_vector<int64_t>(), (std::vector<int64_t>{3, 0, 5, 7, 1000}));
    EXPECT_EQ(raw::unary(UnaryOp::square, x).to_vector<int64_t>(), (std::vector<int64_t>{9, 0, 25, 49, 1000000}));
    EXPECT_EQ(raw::neg(x).dtype(), dtype);
    EXPECT_CPF_ERROR(raw::exp(x), std::string("exp: needs a floating tensor, got ") + dtype_name(dtype) + " [5]");
  }
}

TEST(Unary, BackwardMatchesDerivatives) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (UnaryOp op : kUnaryOps) {
      SCOPED_TRACE(std::string(raw::op_name(op)) + " " + dtype_name(dtype));
      // Keep clear of relu/abs kinks so the finite-difference reference is exact enough.
      Tensor x = positive_domain(op) ? random_tensor({5, 6}, DType::f64, 5, 0.2, 3.0)
                                     : random_tensor({5, 6}, DType::f64, 5, 0.05, 2.0);
      Generator sign_gen(9);
      Tensor sign = raw::add(raw::to(randint(0, 2, {5, 6}, {.dtype = DType::i64}, &sign_gen), DType::f64), -0.5);
      if (!positive_domain(op)) x = raw::mul(x, sign);  // random signs, |x| in [0.025, 1]
      Tensor g = random_tensor({5, 6}, DType::f64, 6);
      Tensor xd = raw::to(x, dtype), gd = raw::to(g, dtype);
      Tensor dx = raw::unary_backward(op, gd, xd, raw::unary(op, xd));
      EXPECT_EQ(dx.dtype(), dtype);
      std::vector<double> expected;
      const auto xv = xd.to_vector<double>(), gv = gd.to_vector<double>();
      for (size_t i = 0; i < xv.size(); ++i) expected.push_back(gv[i] * ref_derivative(op, xv[i]));
      const double t = dtype == DType::f64 ? 1e-7 : dtype == DType::f32 ? 1e-4 : 3e-2;
      EXPECT_TRUE(all_close(dx, as_f64(expected, x.shape()), t, t));
    }
  }
}

TEST(Unary, Errors) {
  Tensor b = from_vector<bool>({true}, {1});
  EXPECT_CPF_ERROR(raw::neg(b), "neg: not defined for bool tensors");
  EXPECT_CPF_ERROR(raw::unary(UnaryOp::abs, b), "abs: not defined for bool tensors");
  EXPECT_CPF_ERROR(raw::unary(UnaryOp::tanh, zeros({2, 2}, {.dtype = DType::i32})),
                   "tanh: needs a floating tensor, got i32 [2,2]");
  EXPECT_CPF_ERROR(raw::unary(UnaryOp::sqrt, Tensor()), "sqrt: argument 'x' is an undefined tensor");
  Tensor x = zeros({2, 3});
  EXPECT_CPF_ERROR(raw::unary_backward(UnaryOp::exp, zeros({3, 2}), x, x),
                   "exp backward: grad [3,2], x [2,3] and y [2,3] must have one shape");
  EXPECT_CPF_ERROR(raw::unary_backward(UnaryOp::exp, zeros({2, 3}, {.dtype = DType::f64}), x, x),
                   "exp: dtypes differ: f64 [2,3] vs f32 [2,3]");
  EXPECT_CPF_ERROR(raw::unary_backward(UnaryOp::neg, zeros({2}, {.dtype = DType::i64}),
                                       zeros({2}, {.dtype = DType::i64}), zeros({2}, {.dtype = DType::i64})),
                   "neg: dtype i64 is not supported");
}

// ---- binary ----

// Pairs of shapes that broadcast in every position: trailing, leading, middle, both sides, scalars.
const std::pair<Shape, Shape> kBroadcastCases[] = {
    {{3, 4}, {3, 4}},       {{3, 4}, {4}}, {{4}, {3, 4}}, {{3, 1}, {1, 4}}, {{2, 1, 4}, {3, 1}}, {{2, 3, 4}, {2, 1, 4}},
    {{1, 3, 1}, {2, 1, 5}}, {{}, {2, 3}},  {{2, 3}, {}},  {{}, {}},         {{5}, {1}},          {{2, 0, 3}, {3}},
    {{1}, {2, 0}},
};

TEST(Binary, EveryOpWithBroadcastingMatchesTheReference) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (BinaryOp op : kBinaryOps) {
      for (const auto& [sa, sb] : kBroadcastCases) {
        SCOPED_TRACE(std::string(raw::op_name(op)) + " " + dtype_name(dtype) + " " + shape_str(sa) + " " +
                     shape_str(sb));
        const bool positive = op == BinaryOp::pow || op == BinaryOp::div;
        Tensor a = random_tensor(sa, dtype, 11, positive ? 0.5 : -2.0, 2.0);
        Tensor b = random_tensor(sb, dtype, 12, positive ? 0.5 : -2.0, 2.0);
        Tensor y = raw::binary(op, a, b);
        Shape shape;
        const auto expected = naive_binary(
            a, b, [op](double x, double z) { return ref_binary(op, x, z); }, &shape);
        EXPECT_EQ(y.shape(), shape);
        EXPECT_EQ(y.dtype(), dtype);
        EXPECT_TRUE(all_close(y, as_f64(expected, shape), tol(dtype), tol(dtype)));
      }
    }
  }
}

TEST(Binary, NonContiguousOperands) {
  Tensor base = random_tensor({6, 8}, DType::f64, 21);
  Tensor other = random_tensor({8, 6}, DType::f64, 22, 0.5, 2.0);
  const std::vector<std::pair<Tensor, Tensor>> cases{
      {raw::transpose(base, 0, 1), other},                                                  // transposed vs contiguous
      {raw::slice(base, 1, 0, 8, 2), raw::transpose(raw::slice(other, 0, 1, 8, 2), 0, 1)},  // stepped, both
      {raw::expand(raw::narrow(base, 0, 2, 1), {5, 8}), raw::narrow(raw::transpose(other, 0, 1), 0, 1, 5)},
      {raw::select(base, 1, 3), raw::select(other, 0, 7)},  // strided 1-D
      {raw::permute(raw::reshape(base, {2, 3, 8}), {2, 0, 1}), raw::reshape(raw::select(other, 1, 0), {8, 1, 1})},
  };
  for (const auto& [a, b] : cases) {
    for (BinaryOp op : {BinaryOp::add, BinaryOp::mul, BinaryOp::div, BinaryOp::maximum}) {
      SCOPED_TRACE(std::string(raw::op_name(op)) + " " + shape_str(a.shape()) + " " + shape_str(b.shape()));
      Shape shape;
      const auto expected = naive_binary(
          a, b, [op](double x, double z) { return ref_binary(op, x, z); }, &shape);
      EXPECT_TRUE(all_close(raw::binary(op, a, b), as_f64(expected, shape), 1e-14, 1e-14));
    }
  }
}

TEST(Binary, LargeInputsTakeTheParallelPath) {
  // >= 1<<16 elements, in several layouts: contiguous, broadcast row/column, transposed.
  Tensor a = random_tensor({257, 513}, DType::f32, 31);
  Tensor row = random_tensor({513}, DType::f32, 32);
  Tensor col = random_tensor({257, 1}, DType::f32, 33);
  Tensor at = raw::transpose(random_tensor({513, 257}, DType::f32, 34), 0, 1);
  for (const Tensor& b : {a, row, col, at}) {
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::minimum}) {
      Shape shape;
      const auto expected = naive_binary(
          a, b, [op](double x, double z) { return ref_binary(op, x, z); }, &shape);
      EXPECT_TRUE(all_close(raw::binary(op, a, b), as_f64(expected, shape), 1e-6, 1e-6))
          << raw::op_name(op) << " " << shape_str(b.shape());
    }
  }
  // A 3-D case whose inner dims merge into one row.
  Tensor c = random_tensor({4, 128, 256}, DType::f64, 35);
  Tensor d = random_tensor({4, 1, 256}, DType::f64, 36);
  Shape shape;
  const auto expected = naive_binary(
      c, d, [](double x, double z) { return x * z; }, &shape);
  EXPECT_TRUE(all_close(raw::mul(c, d), as_f64(expected, shape), 1e-15, 1e-15));
}

TEST(Binary, ScalarOperand) {
  Tensor a = random_tensor({3, 4}, DType::f32, 41);
  const auto av = a.to_vector<double>();
  const auto y = raw::add(a, 2.5).to_vector<double>();
  const auto z = raw::mul(a, -3.0).to_vector<double>();
  const auto p = raw::binary(BinaryOp::pow, raw::unary(UnaryOp::abs, a), 2.0).to_vector<double>();
  for (size_t i = 0; i < av.size(); ++i) {
    EXPECT_NEAR(y[i], av[i] + 2.5, 1e-6);
    EXPECT_NEAR(z[i], av[i] * -3.0, 1e-6);
    EXPECT_NEAR(p[i], av[i] * av[i], 1e-6);
  }
  EXPECT_EQ(raw::add(a, 1.0).shape(), a.shape());
  EXPECT_EQ(raw::add(scalar_tensor(1.0), 1.0).dim(), 0);
}

TEST(Binary, NaNPropagatesThroughMaximumAndMinimum) {
  Tensor a = from_vector<float>({NAN, 1, NAN, 2}, {4});
  Tensor b = from_vector<float>({1, NAN, NAN, 3}, {4});
  for (BinaryOp op : {BinaryOp::maximum, BinaryOp::minimum}) {
    const auto v = raw::binary(op, a, b).to_vector<float>();
    EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1]) && std::isnan(v[2])) << raw::op_name(op);
    EXPECT_EQ(v[3], op == BinaryOp::maximum ? 3.0f : 2.0f);
  }
}

TEST(Binary, IntegerOps) {
  for (DType dtype : {DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = raw::to(from_vector<int64_t>({7, -7, 9, 0, 100, -3}, {2, 3}), dtype);
    Tensor b = raw::to(from_vector<int64_t>({2, 3, -4}, {3}), dtype);
    for (BinaryOp op : kBinaryOps) {
      Shape shape;
      const auto expected = naive_binary(
          a, b,
          [op](double x, double z) {
            if (op == BinaryOp::div) return std::trunc(x / z);  // C++ integer division truncates
            if (op == BinaryOp::pow) return std::trunc(std::pow(x, z));
            return ref_binary(op, x, z);
          },
          &shape);
      Tensor y = raw::binary(op, a, b);
      EXPECT_EQ(y.dtype(), dtype);
      EXPECT_EQ(y.to_vector<double>(), expected) << raw::op_name(op);
    }
  }
  // i64 keeps values beyond 2^53 exact.
  const int64_t big = (int64_t{1} << 60) + 1;
  Tensor x = from_vector<int64_t>({big}, {1});
  EXPECT_EQ(raw::add(x, from_vector<int64_t>({2}, {1})).item<int64_t>(), big + 2);
  EXPECT_EQ(raw::binary(BinaryOp::maximum, x, from_vector<int64_t>({big - 1}, {1})).item<int64_t>(), big);
  // Overflow wraps instead of being undefined behaviour.
  const int32_t imax = std::numeric_limits<int32_t>::max(), imin = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(raw::add(from_vector<int32_t>({imax}, {1}), from_vector<int32_t>({1}, {1})).item<int32_t>(), imin);
  EXPECT_EQ(raw::div(from_vector<int32_t>({imin}, {1}), from_vector<int32_t>({-1}, {1})).item<int32_t>(), imin);
  EXPECT_EQ(raw::mul(from_vector<int32_t>({65536}, {1}), from_vector<int32_t>({65536}, {1})).item<int32_t>(), 0);
}

TEST(Binary, IntegerDivisionByZeroThrowsEvenOnThreads) {
  Tensor a = full({4}, 3.0, {.dtype = DType::i32});
  EXPECT_CPF_ERROR(raw::div(a, from_vector<int32_t>({1, 0, 2, 3}, {4})), "div: integer division by zero");
  // Large enough for the OpenMP path: the error must still surface as an exception.
  Tensor big = full({1 << 17}, 3.0, {.dtype = DType::i64});
  Tensor divisor = full({1 << 17}, 1.0, {.dtype = DType::i64});
  raw::fill_(raw::narrow(divisor, 0, 100000, 1), 0.0);
  EXPECT_CPF_ERROR(raw::div(big, divisor), "div: integer division by zero (divisor of shape [131072])");
  // Floating division by zero is IEEE.
  EXPECT_EQ(raw::div(ones({1}), zeros({1})).item<float>(), INFINITY);
}

TEST(Binary, Errors) {
  Tensor f = zeros({2, 3});
  Tensor d = zeros({2, 3}, {.dtype = DType::f64});
  EXPECT_CPF_ERROR(raw::add(f, d), "add: dtypes differ: f32 [2,3] vs f64 [2,3] (convert one with to(dtype))");
  EXPECT_CPF_ERROR(raw::mul(f, zeros({4})), "mul: shapes [2,3] and [4] are not broadcastable (dim 1: 3 vs 4)");
  EXPECT_CPF_ERROR(raw::sub(zeros({2, 1, 3}), zeros({4, 2})),
                   "sub: shapes [2,1,3] and [4,2] are not broadcastable (dim 2: 3 vs 2)");
  EXPECT_CPF_ERROR(raw::binary(BinaryOp::pow, zeros({5}), zeros({2, 3})),
                   "pow: shapes [5] and [2,3] are not broadcastable");
  Tensor b = from_vector<bool>({true, false}, {2});
  EXPECT_CPF_ERROR(raw::add(b, b), "add: not defined for bool tensors");
  EXPECT_CPF_ERROR(raw::div(Tensor(), f), "div: argument 'a' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::div(f, Tensor()), "div: argument 'b' is an undefined tensor");
}

}  // namespace
}  // namespace cpf
