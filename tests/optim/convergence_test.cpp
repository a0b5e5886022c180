// End-to-end: each optimizer fits a small least-squares problem through autograd, with the
// schedule and clipping in the loop the way the trainer uses them.
#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/optim/adamw.h"
#include "framework/optim/grad_clip.h"
#include "framework/optim/lr_schedule.h"
#include "framework/optim/sgd.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

struct Problem {
  Tensor x, y;  // (64, 5), (64, 2)
  Tensor w, b;  // (5, 2), (2)
  optim::NamedTensors params() const { return {{"proj.weight", w}, {"proj.bias", b}}; }
  Tensor loss() const {
    Tensor diff = sub(add(matmul(x, w), b), y);
    return mean(mul(diff, diff));
  }
};

Problem make_problem() {
  Generator gen(21);
  Problem p;
  p.x = randn({64, 5}, {}, &gen);
  const Tensor w_true = randn({5, 2}, {}, &gen);
  const Tensor b_true = randn({2}, {}, &gen);
  p.y = add(matmul(p.x, w_true), b_true);
  p.w = zeros({5, 2});
  p.w.set_requires_grad(true);
  p.b = zeros({2});
  p.b.set_requires_grad(true);
  return p;
}

// Runs `steps` steps and returns the losses before each step and after the last.
std::vector<double> train(Problem& p, optim::Optimizer& opt, const optim::LrSchedule& schedule, int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    Tensor loss = p.loss();
    losses.push_back(loss.item<double>());
    backward(loss);
    const double norm = optim::clip_grad_norm_(p.params(), 5.0);
    EXPECT_TRUE(std::isfinite(norm));
    opt.set_lr(schedule.lr_at(opt.step_count()));
    opt.step();
    opt.zero_grad();
  }
  losses.push_back(p.loss().item<double>());
  return losses;
}

TEST(Convergence, AdamWFitsLeastSquares) {
  Problem p = make_problem();
  optim::AdamW opt(p.params(), {.lr = 0.1, .weight_decay = 0.0});
  const optim::LrSchedule schedule({.lr = 0.1, .min_lr = 0.001, .warmup_steps = 10, .total_steps = 300});
  const std::vector<double> losses = train(p, opt, schedule, 300);
  EXPECT_LT(losses.back(), 1e-3 * losses.front()) << "first " << losses.front() << " last " << losses.back();
  EXPECT_EQ(opt.step_count(), 300);
}

TEST(Convergence, SGDMomentumFitsLeastSquaresMonotonically) {
  Problem p = make_problem();
  optim::SGD opt(p.params(), {.lr = 0.05, .momentum = 0.0});
  const optim::LrSchedule schedule({.decay = optim::LrDecay::constant, .lr = 0.05});
  const std::vector<double> losses = train(p, opt, schedule, 200);
  // Gradient descent with a small step on a convex quadratic never increases the loss.
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_LE(losses[i], losses[i - 1]) << "step " << i;
  EXPECT_LT(losses.back(), 1e-3 * losses.front());

  Problem q = make_problem();
  optim::SGD momentum(q.params(), {.lr = 0.02, .momentum = 0.9, .nesterov = true});
  const std::vector<double> mlosses = train(q, momentum, schedule, 200);
  EXPECT_LT(mlosses.back(), 1e-3 * mlosses.front());
}

TEST(Convergence, AdamWWeightDecayShrinksTowardZeroWithoutGradientSignal) {
  // Decoupled decay alone: with zero gradients a decayed weight shrinks geometrically by (1 - lr wd).
  Tensor w = ones({2, 2});
  w.set_requires_grad(true);
  optim::AdamW opt({{"w", w}}, {.lr = 0.1, .weight_decay = 1.0});
  for (int s = 0; s < 10; ++s) {
    w.set_grad(zeros({2, 2}));
    opt.step();
  }
  EXPECT_NEAR(w.to_vector<float>()[0], std::pow(0.9, 10), 1e-6);
}

}  // namespace
}  // namespace cpf
