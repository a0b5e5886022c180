#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "framework/optim/sgd.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using optim::NamedTensors;
using optim::SGD;
using optim::SGDOptions;

Tensor param(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor p = testing::random_tensor(shape, dtype, seed);
  p.set_requires_grad(true);
  return p;
}

// torch.optim.SGD with dampening 0, in plain doubles.
void reference_sgd(std::vector<double>& p, std::vector<double>& buf, const std::vector<double>& g, const SGDOptions& o,
                   double wd) {
  for (size_t i = 0; i < p.size(); ++i) {
    double d = g[i] + wd * p[i];
    if (o.momentum > 0) {
      buf[i] = o.momentum * buf[i] + d;
      d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
    }
    p[i] -= o.lr * d;
  }
}

void expect_matches_reference(const SGDOptions& options, DType dtype, double tol) {
  Tensor w = param({3, 2}, dtype, 11);
  Tensor b = param({2}, dtype, 12);
  SGD opt({{"fc.weight", w}, {"fc.bias", b}}, options);
  EXPECT_EQ(opt.state_slots().size(), options.momentum > 0 ? 1u : 0u);
  std::vector<double> rw = w.to_vector<double>(), rb = b.to_vector<double>();
  std::vector<double> bw(6), bb(2);
  for (int step = 1; step <= 4; ++step) {
    const Tensor gw = testing::random_tensor({3, 2}, dtype, 300 + step);
    const Tensor gb = testing::random_tensor({2}, dtype, 400 + step);
    const std::vector<double> gw0 = gw.to_vector<double>();
    w.set_grad(gw);
    b.set_grad(gb);
    opt.step();
    reference_sgd(rw, bw, gw0, options, options.weight_decay);
    reference_sgd(rb, bb, gb.to_vector<double>(), options, 0.0);
    ASSERT_TRUE(testing::all_close(w, from_vector(rw, {3, 2}), tol, tol)) << "step " << step;
    ASSERT_TRUE(testing::all_close(b, from_vector(rb, {2}), tol, tol)) << "step " << step;
    EXPECT_EQ(gw.to_vector<double>(), gw0) << "the gradient must not be modified";
  }
  if (options.momentum > 0) {
    EXPECT_EQ(opt.state_tensors()[0].first, "momentum_buffer.fc.weight");
    EXPECT_TRUE(testing::all_close(opt.state_tensors()[0].second, from_vector(bw, {3, 2}), tol, tol));
  }
}

TEST(SGD, PlainMatchesReference) { expect_matches_reference({.lr = 0.1, .momentum = 0.0}, DType::f64, 1e-13); }
TEST(SGD, MomentumMatchesReference) { expect_matches_reference({.lr = 0.1, .momentum = 0.9}, DType::f64, 1e-13); }
TEST(SGD, NesterovWithWeightDecayMatchesReference) {
  expect_matches_reference({.lr = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 0.2}, DType::f64, 1e-13);
}
TEST(SGD, MomentumWithWeightDecayMatchesReferenceInF32) {
  expect_matches_reference({.lr = 0.05, .momentum = 0.5, .weight_decay = 0.1}, DType::f32, 1e-6);
}

TEST(SGD, Bf16ParameterUpdatesThroughF32) {
  Tensor w = param({4}, DType::bf16, 13);
  SGD opt({{"w", w}}, {.lr = 0.5, .momentum = 0.0});
  const std::vector<double> before = w.to_vector<double>();
  w.set_grad(full({4}, 0.25, {.dtype = DType::bf16}));
  opt.step();
  const std::vector<double> after = w.to_vector<double>();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_DOUBLE_EQ(after[i], static_cast<double>(bfloat16(static_cast<float>(before[i] - 0.125)))) << i;
  }
}

TEST(SGD, RejectsInvalidOptions) {
  const NamedTensors params = {{"w", param({2}, DType::f32, 1)}};
  EXPECT_CPF_ERROR(SGD(params, {.lr = -0.1}), "sgd: lr must be finite and >= 0, got -0.1");
  EXPECT_CPF_ERROR(SGD(params, {.momentum = 1.0}), "sgd: momentum must be in [0, 1), got 1");
  EXPECT_CPF_ERROR(SGD(params, {.momentum = -0.5}), "sgd: momentum must be in [0, 1), got -0.5");
  EXPECT_CPF_ERROR(SGD(params, {.momentum = 0.0, .nesterov = true}), "sgd: nesterov needs momentum > 0");
  EXPECT_CPF_ERROR(SGD(params, {.weight_decay = INFINITY}), "sgd: weight_decay must be finite and >= 0, got inf");
  EXPECT_CPF_ERROR(SGD(NamedTensors{}, {}), "sgd: no parameters to optimize");
}

}  // namespace
}  // namespace cpf
