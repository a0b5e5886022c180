// Optimizer::step(skip_if_nonfinite) + commit(applied): the step whose skip is decided where the
// parameters are (on the CPU the host reads the sum and applies the rule, the reference of the CUDA AdamW
// kernel's decision). Against the host-decided path: read the norm, call step() only when it is finite.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "framework/optim/adamw.h"
#include "framework/optim/grad_clip.h"
#include "framework/optim/sgd.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using optim::NamedTensors;

NamedTensors make_params(DType dtype) {
  NamedTensors params{{"w", testing::random_tensor({6, 5}, dtype, 1)}, {"b", testing::random_tensor({5}, dtype, 2)}};
  for (auto& [name, p] : params) p.set_requires_grad(true);
  return params;
}

// Gradients of step `step`; step 2 of a poisoned run holds a NaN (or an inf) in "b".
void set_grads(const NamedTensors& params, int step, double poison) {
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i].second;
    Tensor g = raw::to(testing::random_tensor(p.shape(), DType::f64, 100 * step + i, -2.0, 2.0), p.dtype());
    if (step == 2 && i == 1) g = full(p.shape(), poison, {.dtype = p.dtype()});
    p.set_grad(g);
  }
}

std::vector<std::vector<double>> values(const NamedTensors& tensors) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : tensors) out.push_back(t.to_vector<double>());
  return out;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& kind, const NamedTensors& params) {
  if (kind == "sgd") return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1, .weight_decay = 0.01});
  return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 0.05, .weight_decay = 0.1});
}

// Four steps, step 2 non-finite: the deferred path against the host-decided one, bit for bit, with the
// step after the skipped one using t = 2 in AdamW's bias corrections on both sides.
void expect_same_as_host_decided(const std::string& kind, DType dtype, double poison) {
  const NamedTensors host_params = make_params(dtype), deferred_params = make_params(dtype);
  const auto host = make_optimizer(kind, host_params), deferred = make_optimizer(kind, deferred_params);
  for (int step = 1; step <= 4; ++step) {
    set_grads(host_params, step, poison);
    set_grads(deferred_params, step, poison);
    if (std::isfinite(optim::grad_norm(host_params))) host->step();
    const Tensor sum = optim::grad_sum_squares(deferred_params);
    const std::vector<std::vector<double>> before = values(deferred_params);
    const NamedTensors state_before = deferred->state_tensors();
    const std::vector<std::vector<double>> state_values_before = values(state_before);
    deferred->step(sum);
    EXPECT_TRUE(deferred->step_in_flight());
    const bool applied = std::isfinite(std::sqrt(sum.item<double>()));
    EXPECT_EQ(applied, step != 2);
    if (!applied) {  // nothing moved before the commit
      EXPECT_EQ(values(deferred_params), before) << kind;
      EXPECT_EQ(values(deferred->state_tensors()), state_values_before) << kind;
    }
    deferred->commit(applied);
    EXPECT_FALSE(deferred->step_in_flight());
    EXPECT_EQ(deferred->step_count(), host->step_count()) << kind << " step " << step;
    EXPECT_EQ(values(deferred_params), values(host_params)) << kind << " " << dtype << " step " << step;
    EXPECT_EQ(values(deferred->state_tensors()), values(host->state_tensors())) << kind << " step " << step;
  }
  EXPECT_EQ(deferred->step_count(), 3);
}

TEST(DeferredStep, AdamWMatchesTheHostDecidedStepAcrossASkippedOne) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    expect_same_as_host_decided("adamw", dtype, NAN);
    expect_same_as_host_decided("adamw", dtype, INFINITY);
  }
}

TEST(DeferredStep, SgdMatchesTheHostDecidedStepAcrossASkippedOne) {
  expect_same_as_host_decided("sgd", DType::f32, NAN);
  expect_same_as_host_decided("sgd", DType::f64, -INFINITY);
}

TEST(DeferredStep, RejectsMisuse) {
  const NamedTensors params = make_params(DType::f32);
  optim::AdamW opt(params, {});
  set_grads(params, 1, 0.0);
  EXPECT_CPF_ERROR(opt.commit(true), "adamw: commit without a step(skip_if_nonfinite) in flight");
  EXPECT_CPF_ERROR(opt.step(Tensor()),
                   "adamw: skip_if_nonfinite must be one f64 element (a gradient sum of squares), got undefined");
  EXPECT_CPF_ERROR(opt.step(zeros({1})), "got f32 of shape [1]");
  EXPECT_CPF_ERROR(opt.step(zeros({2}, {.dtype = DType::f64})), "got f64 of shape [2]");
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_FALSE(opt.step_in_flight());

  opt.step(optim::grad_sum_squares(params));
  EXPECT_CPF_ERROR(opt.step(),
                   "adamw: step 1 was enqueued with step(skip_if_nonfinite) and not committed; call "
                   "commit(applied) first");
  EXPECT_CPF_ERROR(opt.step(optim::grad_sum_squares(params)), "call commit(applied) first");
  EXPECT_CPF_ERROR(opt.load_state(opt.state_tensors(), 5),
                   "adamw: load_state while step 1 is in flight; call commit(applied) first");
  // On the CPU the sum was read by step(): a commit that contradicts it is a caller's bug.
  EXPECT_CPF_ERROR(opt.commit(false),
                   "adamw: commit(false) but the step's sum of squares read on the host says applied");
  opt.commit(true);
  EXPECT_EQ(opt.step_count(), 1);

  opt.step(full({1}, NAN, {.dtype = DType::f64}));
  EXPECT_CPF_ERROR(opt.commit(true), "adamw: commit(true) but the step's sum of squares read on the host says skipped");
  opt.commit(false);
  EXPECT_EQ(opt.step_count(), 1);

  // A step whose read-back failed is abandoned: the count stays and the optimizer takes steps again.
  EXPECT_CPF_ERROR(opt.abandon(), "adamw: abandon without a step(skip_if_nonfinite) in flight");
  opt.step(optim::grad_sum_squares(params));
  opt.abandon();
  EXPECT_FALSE(opt.step_in_flight());
  EXPECT_EQ(opt.step_count(), 1);
  opt.step();
  EXPECT_EQ(opt.step_count(), 2);
}

}  // namespace
}  // namespace cpf
