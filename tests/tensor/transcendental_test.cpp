// The vectorised f32 exp/sigmoid/silu/gelu against double-precision references, over ranges that
// stress both branches of the logistic, extreme and special values, and sizes that split into
// blocks and threads.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "framework/tensor/cpu/transcendental.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

double reference(cpu::FastUnary op, double x) {
  const double logistic_x = 1.0 / (1.0 + std::exp(-x));
  switch (op) {
    case cpu::FastUnary::exp: return std::exp(x);
    case cpu::FastUnary::sigmoid: return logistic_x;
    case cpu::FastUnary::silu: return x * logistic_x;
    // 0.5 x (1 + tanh z) = x / (1 + exp(-2z)): the second form has no cancellation for negative x.
    case cpu::FastUnary::gelu: return x / (1.0 + std::exp(-2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x)));
  }
  return 0;
}

std::vector<float> inputs(int64_t n, double low, double high) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(low + (high - low) * (i + 0.5) / n);
  return x;
}

TEST(FastUnary, MatchesDoubleReferencesToAFewUlp) {
  for (auto op : {cpu::FastUnary::exp, cpu::FastUnary::sigmoid, cpu::FastUnary::silu, cpu::FastUnary::gelu}) {
    const double low = op == cpu::FastUnary::exp ? -80.0 : -30.0, high = op == cpu::FastUnary::exp ? 80.0 : 30.0;
    const auto x = inputs(100003, low, high);  // several blocks, the threaded path, a ragged tail
    std::vector<float> y(x.size());
    cpu::fast_unary_f32(op, x.data(), y.data(), static_cast<int64_t>(x.size()));
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = reference(op, x[i]);
      // gelu's logistic argument is itself computed in f32, so in its far negative tail (values below
      // 1e-3) the error is relative to 1e-3, not to the tiny value (the plain f32 formula is far worse
      // there: 1 + tanh(z) cancels).
      const double scale = op == cpu::FastUnary::gelu ? std::max(std::abs(want), 1e-3) : std::abs(want);
      worst = std::max(worst, std::abs(y[i] - want) / std::max(scale, 1e-30));
    }
    EXPECT_LT(worst, 2e-6) << "op " << static_cast<int>(op);  // ~16 ulp bound; measured a few ulp
  }
}

TEST(FastUnary, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x{0.0f, -0.0f, inf, -inf, nan, 100.0f, -50.0f, -1e-20f};
  std::vector<float> y(x.size());
  cpu::fast_unary_f32(cpu::FastUnary::sigmoid, x.data(), y.data(), 8);
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[2], 1.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_EQ(y[5], 1.0f);
  EXPECT_NEAR(y[6], 1.9287e-22f, 1e-26f);  // no cancellation: a tiny sigmoid keeps its digits
  cpu::fast_unary_f32(cpu::FastUnary::exp, x.data(), y.data(), 8);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[2], inf);
  EXPECT_EQ(y[3], 0.0f);  // exactly 0, not a subnormal
  EXPECT_TRUE(std::isnan(y[4]));
  cpu::fast_unary_f32(cpu::FastUnary::gelu, x.data(), y.data(), 8);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[2], inf);
  EXPECT_EQ(y[5], 100.0f);
  EXPECT_EQ(y[6], 0.0f);  // -50 * logistic(-104.7): below the smallest normal float
  EXPECT_TRUE(std::isnan(y[4]));
}

TEST(FastUnary, RawOpsUseItOnlyForContiguousF32) {
  Tensor x = testing::random_tensor({256, 300}, DType::f32, 3, -8, 8);
  Tensor strided = raw::transpose(x, 0, 1);  // the generic path
  for (auto op : {raw::UnaryOp::exp, raw::UnaryOp::sigmoid, raw::UnaryOp::silu, raw::UnaryOp::gelu}) {
    Tensor fast = raw::unary(op, x);
    Tensor generic = raw::unary(op, raw::contiguous(strided));
    EXPECT_TRUE(testing::all_close(raw::transpose(raw::unary(op, strided), 0, 1), fast, 1e-6, 2e-6))
        << raw::op_name(op);
    (void)generic;
  }
}

}  // namespace
}  // namespace cpf
