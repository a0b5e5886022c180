// Optimizer::step_deferred + settle: several steps in flight before the host knows whether earlier ones
// were applied. On the CPU the value is read at once (the reference of the CUDA AdamW kernel's device
// count of applied steps); against the host-decided path (read the norm, call step() only when finite)
// bit for bit whatever the windows the outcomes are settled in, and every refusal with its message.
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

// Gradients of step `step`; steps 2, 5 and 6 hold a non-finite value in "b".
bool poisoned(int step) { return step == 2 || step == 5 || step == 6; }

void set_grads(const NamedTensors& params, int step) {
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i].second;
    Tensor g = raw::to(testing::random_tensor(p.shape(), DType::f64, 100 * step + i, -2.0, 2.0), p.dtype());
    if (poisoned(step) && i == 1) g = full(p.shape(), step == 5 ? INFINITY : NAN, {.dtype = p.dtype()});
    p.set_grad(g);
  }
}

std::vector<std::vector<double>> values(const NamedTensors& params, const optim::Optimizer& opt) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : params) out.push_back(t.to_vector<double>());
  for (const auto& [name, t] : opt.state_tensors()) out.push_back(t.to_vector<double>());
  return out;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& kind, const NamedTensors& params) {
  if (kind == "sgd") {
    return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  }
  return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 0.05, .weight_decay = 0.1});
}

// Eight steps (2, 5, 6 non-finite) with a per-step lr, settled in windows of `window` steps (the last
// window shorter): same parameters, state and step count as the host-decided run after every settle.
void expect_same_as_host_decided(const std::string& kind, DType dtype, int window) {
  const NamedTensors host_params = make_params(dtype), deferred_params = make_params(dtype);
  const auto host = make_optimizer(kind, host_params), deferred = make_optimizer(kind, deferred_params);
  std::vector<bool> outcomes;
  for (int step = 1; step <= 8; ++step) {
    host->set_lr(0.01 * step);
    deferred->set_lr(0.01 * step);
    set_grads(host_params, step);
    set_grads(deferred_params, step);
    if (std::isfinite(optim::grad_norm(host_params))) host->step();
    const Tensor sum = optim::grad_sum_squares(deferred_params);
    deferred->step_deferred(sum);
    outcomes.push_back(std::isfinite(std::sqrt(sum.item<double>())));
    EXPECT_EQ(outcomes.back(), !poisoned(step));
    EXPECT_EQ(deferred->deferred_in_flight(), static_cast<int64_t>(outcomes.size()));
    if (static_cast<int>(outcomes.size()) < window && step < 8) continue;
    deferred->settle(outcomes);
    outcomes.clear();
    EXPECT_EQ(deferred->deferred_in_flight(), 0);
    EXPECT_EQ(deferred->step_count(), host->step_count()) << kind << " step " << step;
    EXPECT_EQ(values(deferred_params, *deferred), values(host_params, *host))
        << kind << " " << dtype << " window " << window << " step " << step;
  }
  EXPECT_EQ(deferred->step_count(), 5);
}

TEST(StepDeferred, AdamWMatchesTheHostDecidedStepsInEveryWindow) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (int window : {1, 3, 8}) expect_same_as_host_decided("adamw", dtype, window);
  }
}

TEST(StepDeferred, SgdMatchesTheHostDecidedStepsInEveryWindow) {
  for (int window : {1, 4, 8}) expect_same_as_host_decided("sgd", DType::f32, window);
}

TEST(StepDeferred, SettlesTheOldestStepsInOrder) {
  const NamedTensors params = make_params(DType::f32);
  optim::AdamW opt(params, {});
  for (int step = 1; step <= 3; ++step) {  // applied, skipped, applied
    set_grads(params, step);
    opt.step_deferred(optim::grad_sum_squares(params));
  }
  opt.settle({true});
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_EQ(opt.deferred_in_flight(), 2);
  opt.settle({});  // nothing to tell yet: a no-op
  EXPECT_EQ(opt.deferred_in_flight(), 2);
  // The oldest in flight is step 2 (skipped): telling it "applied" is the caller's bug.
  EXPECT_CPF_ERROR(opt.settle({true, true}),
                   "adamw: settle outcome 0 is applied but that step's sum of squares read on the host says skipped");
  EXPECT_EQ(opt.deferred_in_flight(), 2);  // a refused settle changes nothing
  opt.settle({false, true});
  EXPECT_EQ(opt.step_count(), 2);
}

TEST(StepDeferred, RefusesWhatCannotRunWithDeferredStepsInFlight) {
  const NamedTensors params = make_params(DType::f32);
  optim::AdamW opt(params, {});
  set_grads(params, 1);
  EXPECT_CPF_ERROR(opt.step_deferred(Tensor()),
                   "adamw: skip_if_nonfinite must be one f64 element (a gradient sum of squares), got undefined");
  EXPECT_CPF_ERROR(opt.step_deferred(zeros({2}, {.dtype = DType::f64})), "got f64 of shape [2]");
  EXPECT_CPF_ERROR(opt.settle({true}), "adamw: settle of 1 outcome(s) but 0 deferred step(s) are in flight");
  opt.step_deferred(optim::grad_sum_squares(params));
  opt.step_deferred(optim::grad_sum_squares(params));
  EXPECT_CPF_ERROR(opt.step(),
                   "adamw: step() while 2 deferred step(s) are in flight; call settle(applied) with their outcomes "
                   "first");
  EXPECT_CPF_ERROR(opt.step(optim::grad_sum_squares(params)),
                   "adamw: step(skip_if_nonfinite) while 2 deferred step(s) are in flight; call settle(applied)");
  EXPECT_CPF_ERROR(opt.load_state(opt.state_tensors(), 7),
                   "adamw: load_state while 2 deferred step(s) are in flight; call settle(applied)");
  EXPECT_CPF_ERROR(opt.settle({true, true, true}),
                   "adamw: settle of 3 outcome(s) but 2 deferred step(s) are in flight");
  EXPECT_CPF_ERROR(opt.settle({true, false}),
                   "adamw: settle outcome 1 is skipped but that step's sum of squares read on the host says applied");
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_EQ(opt.deferred_in_flight(), 2);

  // A read-back that failed: abandon drops every deferred step, the count stays, steps run again.
  opt.abandon();
  EXPECT_EQ(opt.deferred_in_flight(), 0);
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_CPF_ERROR(opt.abandon(), "adamw: abandon without a step(skip_if_nonfinite) in flight (nor a step_deferred)");
  opt.step();
  EXPECT_EQ(opt.step_count(), 1);

  // step(skip) in flight: no deferred step until it is committed.
  opt.step(optim::grad_sum_squares(params));
  EXPECT_CPF_ERROR(opt.step_deferred(optim::grad_sum_squares(params)),
                   "adamw: step 2 was enqueued with step(skip_if_nonfinite) and not committed; call commit(applied) "
                   "first");
  opt.commit(true);
  opt.step_deferred(optim::grad_sum_squares(params));
  opt.settle({true});
  EXPECT_EQ(opt.step_count(), 3);
}

// An optimizer whose fused deferred update takes the first step (as a device would, leaving its outcome
// unknown to the host) and declines afterwards: the host cannot number the next step and refuses it.
class FirstStepFused : public optim::SGD {
 public:
  using optim::SGD::SGD;

 protected:
  bool update_fused_deferred(const std::vector<FusedItem>& /*items*/, int64_t first_step, int64_t candidates,
                             bool exact, const Tensor& /*skip*/) override {
    if (taken_) return false;
    EXPECT_EQ(first_step, step_count() + 1);
    EXPECT_EQ(candidates, 1);
    EXPECT_TRUE(exact);
    taken_ = true;
    return true;
  }

 private:
  bool taken_ = false;
};

TEST(StepDeferred, RefusesAHostDecisionAfterADeviceDecidedStep) {
  const NamedTensors params = make_params(DType::f32);
  FirstStepFused opt(params, optim::SGDOptions{.lr = 0.1});
  set_grads(params, 1);
  opt.step_deferred(optim::grad_sum_squares(params));
  EXPECT_CPF_ERROR(opt.step_deferred(optim::grad_sum_squares(params)),
                   "sgd: step_deferred reads its value on the host here (no fused update for these parameters) but 1 "
                   "earlier deferred step(s) were decided on the device, so its step number is unknown; call "
                   "settle(applied) with their outcomes first");
  opt.settle({false});  // a device-decided outcome is whatever the caller read back
  EXPECT_EQ(opt.step_count(), 0);
  opt.step_deferred(optim::grad_sum_squares(params));
  opt.settle({true});
  EXPECT_EQ(opt.step_count(), 1);
}

}  // namespace
}  // namespace cpf
