// The training step (apps/trainer/step/training_step.h) on one CPU rank: its StepResult against the same
// computation by hand (batch_loss, backward, the gradient norm, a plain SGD update), clipping by
// run.grad_clip, and a non-finite gradient norm that skips the update. On two DP thread ranks: steps
// that agree their label count a step ahead (step_prefetch.h) against steps that count it first.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include "apps/trainer/step/step_prefetch.h"
#include "apps/trainer/step/training_step.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/launcher.h"
#include "framework/optim/adamw.h"
#include "framework/optim/grad_clip.h"
#include "framework/optim/sgd.h"
#include "framework/tensor/ops/copy.h"
#include "tests/apps/addition_batches.h"
#include "tests/support/test_utils.h"

namespace cpf::trainer {
namespace {

models::data::DataOptions batch_options() { return cpf::testing::addition_batches(); }

std::unique_ptr<models::GPT> model() {
  Generator gen(11);
  return std::make_unique<models::GPT>(
      models::GPTOptions{.vocab_size = 14, .hidden_size = 16, .num_layers = 2, .num_heads = 2, .dtype = DType::f64},
      &gen);
}

constexpr double kLr = 0.5;

// What one step of plain SGD (no momentum) at kLr does by hand: loss, pre-clip norm, new parameters.
struct ByHand {
  double loss = 0, norm = 0;
  std::map<std::string, std::vector<double>> params;
};
ByHand by_hand(double grad_clip) {
  const auto m = model();
  const optim::NamedTensors params = m->named_parameters();
  models::data::DataLoader loader(batch_options());
  const models::data::Batch batch = loader.next();
  RankGroups g;
  const BatchLoss b = batch_loss(*m, batch, g);
  backward(b.loss);
  ByHand out;
  out.loss = b.loss.item<double>();
  out.norm = optim::grad_norm(params);
  const double factor = grad_clip > 0 && out.norm > grad_clip ? grad_clip / (out.norm + 1e-6) : 1.0;
  for (const auto& [name, p] : params) {
    std::vector<double> v = p.to_vector<double>();
    const std::vector<double> grad = p.grad().to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) v[i] -= kLr * grad[i] * factor;
    out.params[name] = v;
  }
  return out;
}

struct Stepped {
  StepResult result;
  std::unique_ptr<models::GPT> model;
};
Stepped step_with(double grad_clip, bool poison) {
  Stepped s{.result = {}, .model = model()};
  const optim::NamedTensors params = s.model->named_parameters();
  if (poison) {
    NoGradGuard no_grad;
    raw::copy_(params.front().second,
               full(params.front().second.shape(), std::numeric_limits<double>::quiet_NaN(), {.dtype = DType::f64}));
  }
  models::data::DataLoader loader(batch_options());
  RankGroups g;
  optim::SGD sgd(params, optim::SGDOptions{.lr = kLr, .momentum = 0.0});
  const optim::LrSchedule schedule(optim::LrScheduleOptions{.decay = optim::LrDecay::constant, .lr = kLr});
  s.result = training_step(StepParts{.model = *s.model,
                                     .loader = loader,
                                     .groups = g,
                                     .reducer = nullptr,
                                     .params = params,
                                     .optimizer = sgd,
                                     .schedule = schedule,
                                     .accum_steps = 1,
                                     .grad_clip = grad_clip},
                           0);
  return s;
}

void expect_params(const models::GPT& m, const ByHand& expected) {
  for (const auto& [name, p] : m.named_parameters()) {
    EXPECT_TRUE(testing::all_close(p, from_vector(expected.params.at(name), p.shape()), 1e-12, 1e-12)) << name;
    EXPECT_TRUE(!p.grad().defined() || raw::to(p.grad(), DType::f64).to_vector<double>() ==
                                           std::vector<double>(static_cast<size_t>(p.numel()), 0.0))
        << name << ": the step zeroes the gradients";
  }
}

TEST(TrainingStep, ResultAndUpdateMatchTheStepByHand) {
  const ByHand expected = by_hand(0);
  const Stepped s = step_with(0, false);
  EXPECT_NEAR(s.result.loss, expected.loss, 1e-12);
  EXPECT_NEAR(s.result.grad_norm, expected.norm, 1e-12);
  EXPECT_FALSE(s.result.skipped);
  models::data::DataLoader loader(batch_options());
  EXPECT_EQ(s.result.tokens, loader.next().tokens.numel());  // one micro-batch, one DP rank
  expect_params(*s.model, expected);
}

TEST(TrainingStep, ClipsToRunGradClipAndReportsTheNormBeforeClipping) {
  const double norm = by_hand(0).norm;
  const ByHand expected = by_hand(norm / 10);
  const Stepped s = step_with(norm / 10, false);
  EXPECT_NEAR(s.result.grad_norm, norm, 1e-12);
  expect_params(*s.model, expected);
}

TEST(TrainingStep, ANonFiniteNormSkipsTheUpdate) {
  const Stepped s = step_with(0, true);
  EXPECT_TRUE(s.result.skipped);
  EXPECT_FALSE(std::isfinite(s.result.grad_norm));
  const auto fresh = model();
  const optim::NamedTensors before = fresh->named_parameters();
  const optim::NamedTensors after = s.model->named_parameters();
  for (size_t i = 1; i < after.size(); ++i) {  // the first is the poisoned one
    EXPECT_EQ(after[i].second.to_vector<double>(), before[i].second.to_vector<double>()) << after[i].first;
  }
}

// The step count moves only for applied steps (AdamW's bias correction counts them): the step enqueues the
// update as applied and commits the count once the norm is back on the host.
TEST(TrainingStep, OnlyAppliedStepsAdvanceTheOptimizerStepCount) {
  for (bool poison : {true, false}) {
    const auto m = model();
    const optim::NamedTensors params = m->named_parameters();
    if (poison) {
      NoGradGuard no_grad;
      raw::copy_(params.front().second,
                 full(params.front().second.shape(), std::numeric_limits<double>::infinity(), {.dtype = DType::f64}));
    }
    const std::vector<double> untouched = params.back().second.to_vector<double>();
    models::data::DataLoader loader(batch_options());
    RankGroups g;
    optim::AdamW adamw(params, optim::AdamWOptions{.lr = 1e-2});
    const optim::LrSchedule schedule(optim::LrScheduleOptions{.decay = optim::LrDecay::constant, .lr = 1e-2});
    const StepParts parts{.model = *m,
                          .loader = loader,
                          .groups = g,
                          .reducer = nullptr,
                          .params = params,
                          .optimizer = adamw,
                          .schedule = schedule,
                          .accum_steps = 1,
                          .grad_clip = 1.0};
    const StepResult r = training_step(parts, 0);
    EXPECT_EQ(r.skipped, poison);
    EXPECT_FALSE(adamw.step_in_flight());
    EXPECT_EQ(adamw.step_count(), poison ? 0 : 1);
    EXPECT_EQ(params.back().second.to_vector<double>() == untouched, poison);
    for (const auto& [name, state] : adamw.state_tensors()) {
      if (poison) EXPECT_EQ(raw::to(state, DType::f64).to_vector<double>(), std::vector<double>(state.numel(), 0.0));
    }
  }
}

// Two DP thread ranks, two micro-batches a step, AdamW with clipping: `steps` steps with or without the
// read-ahead (without: each step counts its labels with a blocking all-reduce, the path before it).
struct DataParallelRun {
  std::vector<double> losses, norms;
  std::vector<int64_t> tokens;
  std::vector<models::data::DataCursor> cursors;  // the loader's after each step
  std::map<std::string, std::vector<double>> params;
};
int no_stop_signal() { return 0; }
DataParallelRun data_parallel_steps(bool read_ahead, int64_t steps) {
  DataParallelRun run;
  std::mutex mu;
  dist::launch(2, [&](dist::RankContext& ctx) {
    RankGroups g;
    g.world = ctx.world;
    g.dp_rank = ctx.rank;
    g.dp_size = 2;
    const auto m = model();
    const optim::NamedTensors params = m->named_parameters();
    std::vector<Tensor> tensors;
    for (const auto& [name, t] : params) tensors.push_back(t);
    dist::GradientReducer reducer(tensors, ctx.world, dist::GradientReducerOptions{.op = dist::ReduceOp::sum});
    models::data::DataLoader loader(batch_options(), g.dp_rank, 2);
    optim::AdamW adamw(params, optim::AdamWOptions{.lr = 1e-2});
    const optim::LrSchedule schedule(optim::LrScheduleOptions{.decay = optim::LrDecay::constant, .lr = 1e-2});
    StepPrefetch prefetch(no_stop_signal);
    DataParallelRun mine;
    for (int64_t step = 0; step < steps; ++step) {
      const StepResult r = training_step(StepParts{.model = *m,
                                                   .loader = loader,
                                                   .groups = g,
                                                   .reducer = &reducer,
                                                   .params = params,
                                                   .optimizer = adamw,
                                                   .schedule = schedule,
                                                   .accum_steps = 2,
                                                   .grad_clip = 1.0,
                                                   .prefetch = read_ahead ? &prefetch : nullptr},
                                         step);
      mine.losses.push_back(r.loss);
      mine.norms.push_back(r.grad_norm);
      mine.tokens.push_back(r.tokens);
      mine.cursors.push_back(loader.cursor());
    }
    for (const auto& [name, p] : params) mine.params[name] = p.to_vector<double>();
    if (ctx.rank != 0) return;
    std::lock_guard lock(mu);
    run = std::move(mine);
  });
  return run;
}

// The read-ahead changes when the host waits, nothing else: the same batches and label counts, so the
// same losses, norms and parameters bit for bit, and between steps the loader's cursor names the next
// unconsumed batch (what a checkpoint saves). A read-ahead batch lost, repeated or reordered changes the
// losses (every step's batches differ).
TEST(TrainingStep, DataParallelStepsAgreedAStepAheadAreTheSameBitForBit) {
  const DataParallelRun before = data_parallel_steps(false, 4);
  const DataParallelRun ahead = data_parallel_steps(true, 4);
  ASSERT_EQ(before.losses.size(), 4u);
  for (size_t i = 1; i < before.losses.size(); ++i) EXPECT_NE(before.losses[i], before.losses[i - 1]);
  EXPECT_EQ(ahead.losses, before.losses);
  EXPECT_EQ(ahead.norms, before.norms);
  EXPECT_EQ(ahead.tokens, before.tokens);
  EXPECT_TRUE(ahead.cursors == before.cursors);
  EXPECT_EQ(ahead.params, before.params);
}

}  // namespace
}  // namespace cpf::trainer
