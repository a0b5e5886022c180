// fp8_linear (framework/autograd/functions/fp8_linear.h) on the CPU: the forward and the three gradients
// equal the products of the same quantised values (current scaling recomputed here from raw ops), they
// stay close to the bf16 linear, and bad inputs are refused with their names. No finite-difference
// gradcheck: the FP8 casts are piecewise constant and the gradient is the recipe's.
#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/fp8_autocast.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/autograd/functions/linear.h"
#include "framework/autograd/functions/linear_cat.h"
#include "framework/autograd/functions/swiglu.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

double rel_error(const Tensor& actual, const Tensor& expected) {
  const Tensor diff = raw::sub(raw::to(actual, DType::f64), raw::to(expected, DType::f64));
  const double num = std::sqrt(raw::sum(raw::mul(diff, diff)).item<double>());
  const Tensor e = raw::to(expected, DType::f64);
  return num / std::sqrt(raw::sum(raw::mul(e, e)).item<double>());
}

// t's values after an FP8 round trip with its current scale, in f64.
Tensor through_fp8(const Tensor& t, DType fp8) {
  const Tensor scale = raw::fp8_scale(raw::abs_max(t), fp8);
  const Tensor q = raw::quantize_fp8(t, scale, fp8);
  return raw::to(raw::dequantize_fp8(q, raw::unary(raw::UnaryOp::reciprocal, scale), DType::f32), DType::f64);
}

TEST(Fp8Linear, ForwardAndGradientsAreTheProductsOfTheQuantisedValues) {
  const int64_t b = 2, t = 16, k = 32, n = 48;
  const Tensor x = raw::to(random_tensor({b, t, k}, DType::f32, 1), DType::bf16);
  Tensor w = random_tensor({n, k}, DType::f32, 2, -0.2, 0.2).set_requires_grad(true);
  Tensor bias = random_tensor({n}, DType::f32, 3).set_requires_grad(true);
  Tensor xg = raw::to(x, DType::bf16).set_requires_grad(true);
  const Tensor y = fp8_linear(xg, w, bias);
  ASSERT_EQ(y.dtype(), DType::bf16);
  ASSERT_EQ(y.shape(), (Shape{b, t, n}));
  const Tensor gy = raw::to(random_tensor({b, t, n}, DType::f32, 4), DType::bf16);
  backward(y, gy);

  const Tensor x2 = raw::reshape(x, {b * t, k}), g2 = raw::reshape(gy, {b * t, n});
  const Tensor xq = through_fp8(x2, DType::f8e4m3), wq = through_fp8(w, DType::f8e4m3);
  const Tensor gq = through_fp8(g2, DType::f8e5m2);
  const Tensor y_ref =
      raw::add(raw::matmul(xq, raw::transpose(wq, 0, 1)), raw::to(raw::to(bias, DType::bf16), DType::f64));
  // bf16 outputs: one rounding of the f32 result.
  EXPECT_TRUE(all_close(raw::reshape(y, {b * t, n}), y_ref, 1e-2, 1.0 / 128));
  EXPECT_TRUE(all_close(raw::reshape(xg.grad(), {b * t, k}), raw::matmul(gq, wq), 1e-2, 1.0 / 128));
  ASSERT_EQ(w.grad().dtype(), DType::f32);  // f32 master weights get f32 gradients from the GEMM
  EXPECT_TRUE(all_close(w.grad(), raw::matmul(raw::transpose(gq, 0, 1), xq), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(bias.grad(), raw::sum(raw::to(g2, DType::f64), {0}), 1e-5, 1e-5));

  // Close to the unquantised layer: E4M3 and E5M2 keep 3 and 2 mantissa bits.
  const Tensor y_bf16 = linear(x, raw::to(w, DType::bf16), raw::to(bias, DType::bf16));
  EXPECT_LT(rel_error(raw::to(y, DType::f32), raw::to(y_bf16, DType::f32)), 0.06);
}

TEST(Fp8Linear, Bf16WeightsWithoutBiasGetBf16Gradients) {
  const Tensor x = raw::to(random_tensor({16, 16}, DType::f32, 5), DType::bf16);
  Tensor w = raw::to(random_tensor({16, 16}, DType::f32, 6), DType::bf16).set_requires_grad(true);
  const Tensor y = fp8_linear(x, w);
  backward(y, raw::to(random_tensor({16, 16}, DType::f32, 7), DType::bf16));
  EXPECT_EQ(w.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().shape(), (Shape{16, 16}));
}

// A bf16 bias gets the column sums of dY (taken by dY's cast in f32, fp8.h) rounded once to bf16.
TEST(Fp8Linear, Bf16BiasGetsTheColumnSumsOfTheOutputGradient) {
  const Tensor x = raw::to(random_tensor({24, 16}, DType::f32, 8), DType::bf16);
  Tensor w = raw::to(random_tensor({8, 16}, DType::f32, 9), DType::bf16).set_requires_grad(true);
  Tensor bias = raw::to(random_tensor({8}, DType::f32, 10), DType::bf16).set_requires_grad(true);
  const Tensor gy = raw::to(random_tensor({24, 8}, DType::f32, 11), DType::bf16);
  backward(fp8_linear(x, w, bias), gy);
  ASSERT_EQ(bias.grad().dtype(), DType::bf16);
  const Tensor want = raw::to(raw::to(raw::sum(raw::to(gy, DType::f64), {0}), DType::f32), DType::bf16);
  EXPECT_TRUE(testing::same_bytes(bias.grad(), want));
}

// Under Fp8Autocast the linear ops that fit the FP8 GEMM are fp8_linear (bit for bit), those that do not
// (a row count off 16) and every op outside the scope keep their bf16 GEMMs.
TEST(Fp8Linear, AutocastRoutesTheLinearsThatFitAndLeavesTheRest) {
  const Tensor x = raw::to(random_tensor({32, 32}, DType::f32, 1), DType::bf16);
  const Tensor w1 = random_tensor({48, 32}, DType::f32, 2), b1 = random_tensor({48}, DType::f32, 3);
  const Tensor w2 = random_tensor({16, 32}, DType::f32, 4), b2 = random_tensor({16}, DType::f32, 5);
  const Tensor w3 = random_tensor({32, 48}, DType::f32, 6), b3 = random_tensor({32}, DType::f32, 7);
  const auto same = [](const Tensor& a, const Tensor& b) { return all_close(a, b, 0, 0); };
  const Tensor bf16_linear = linear(x, w1, b1);
  {
    const Fp8Autocast fp8;
    EXPECT_TRUE(same(linear(x, w1, b1), fp8_linear(x, w1, b1)));
    EXPECT_TRUE(same(linear_cat(x, {{w1, b1, {}, {}}, {w2, b2, {}, {}}}),
                     fp8_linear(x, raw::cat({w1, w2}, 0), raw::cat({b1, b2}, 0))));
    EXPECT_TRUE(same(gelu_mlp(x, {w1, b1, {}, {}}, {w3, b3, {}, {}}), fp8_linear(gelu(fp8_linear(x, w1, b1)), w3, b3)));
    const Tensor three_rows = raw::narrow(x, 0, 0, 3);  // 3 rows: no FP8 GEMM takes it
    EXPECT_TRUE(same(linear(three_rows, w1, b1), raw::narrow(bf16_linear, 0, 0, 3)));
    EXPECT_FALSE(same(linear(x, w1, b1), bf16_linear));  // FP8 rounding shows
  }
  EXPECT_TRUE(same(linear(x, w1, b1), bf16_linear));  // the scope ended
  EXPECT_FALSE(fp8_autocast_active());
  {
    const Fp8Autocast off(false);
    EXPECT_FALSE(fp8_autocast_active());
  }
}

// fp8_linear_after (the activation fused into the cast of the linear's input) against fp8_linear over the
// autograd activation: on the CPU the fused cast is the composition, so the output and every gradient
// (through the activation's backward, which the op runs itself) are equal.
TEST(Fp8Linear, AfterAnActivationEqualsTheLayerOverTheAutogradActivation) {
  const int64_t m = 32, k = 48, n = 16;
  for (raw::CastActivation act : {raw::CastActivation::gelu, raw::CastActivation::swiglu}) {
    const int64_t width = act == raw::CastActivation::swiglu ? 2 * k : k;
    const Tensor pre = raw::to(random_tensor({2, m / 2, width}, DType::f32, 31, -3, 3), DType::bf16);
    const Tensor w = random_tensor({n, k}, DType::f32, 32, -0.2, 0.2), b = random_tensor({n}, DType::f32, 33);
    const Tensor gy = raw::to(random_tensor({2, m / 2, n}, DType::f32, 34), DType::bf16);
    std::vector<Tensor> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor p = pre.detach().set_requires_grad(true), wi = w.detach().set_requires_grad(true);
      Tensor bi = b.detach().set_requires_grad(true);
      const Tensor y = fused ? fp8_linear_after(act, p, wi, bi, {})
                             : fp8_linear(act == raw::CastActivation::gelu ? gelu(p) : swiglu_packed(p), wi, bi);
      backward(y, gy);
      results[fused] = {y, p.grad(), wi.grad(), bi.grad()};
    }
    ASSERT_EQ(results[1][0].shape(), (Shape{2, m / 2, n}));
    ASSERT_EQ(results[1][1].shape(), pre.shape());
    for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(all_close(results[1][i], results[0][i], 0, 0)) << i;
  }
}

TEST(Fp8Linear, RefusesBadInputsWithTheirNames) {
  const Tensor x = raw::to(random_tensor({4, 16}, DType::f32, 1), DType::bf16);
  const Tensor w = random_tensor({16, 16}, DType::f32, 2);
  EXPECT_CPF_ERROR(fp8_linear(raw::to(x, DType::f32), w), "fp8_linear: x must be bf16");
  EXPECT_CPF_ERROR(fp8_linear(x, raw::to(w, DType::f64)), "fp8_linear: weight must be f32 or bf16, got f64");
  EXPECT_CPF_ERROR(fp8_linear(x, random_tensor({16, 8}, DType::f32, 3)),
                   "fp8_linear: x [4,16] does not match weight [16,8]");
  EXPECT_CPF_ERROR(fp8_linear(x, w, random_tensor({8}, DType::f32, 4)), "fp8_linear: bias must be a (16) f32 tensor");
  EXPECT_CPF_ERROR(fp8_linear(x, w, Tensor(), {.margin = -2}), "fp8_scale: margin must be in [0, 64], got -2");
  const Tensor pre = raw::to(random_tensor({16, 30}, DType::f32, 5), DType::bf16);
  EXPECT_CPF_ERROR(fp8_linear_after(raw::CastActivation::swiglu, pre, w, Tensor(), {}),
                   "fp8_linear: pre [16,30] does not match weight [16,16] (pre (..., 2 K) = [gate | up] with weight "
                   "(N, K))");
  EXPECT_CPF_ERROR(fp8_linear_after(raw::CastActivation::gelu, pre, w, Tensor(), {}),
                   "fp8_linear: pre [16,30] does not match weight [16,16] (x (..., K) with weight (N, K))");
  EXPECT_CPF_ERROR(fp8_linear_after(raw::CastActivation::swiglu, raw::narrow(pre, 1, 0, 15), w, Tensor(), {}),
                   "fp8_linear: pre [16,15] does not match weight [16,16] (pre (..., 2 K) = [gate | up]");
}

}  // namespace
}  // namespace cpf
