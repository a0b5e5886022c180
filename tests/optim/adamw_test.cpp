#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/optim/adamw.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using optim::AdamW;
using optim::AdamWOptions;
using optim::NamedTensors;

Tensor param(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor p = testing::random_tensor(shape, dtype, seed);
  p.set_requires_grad(true);
  return p;
}

// One AdamW step in plain doubles, written from the paper's update with torch's bias correction.
void reference_adamw(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                     const std::vector<double>& g, const AdamWOptions& o, double wd, int step) {
  const double bc1 = 1.0 - std::pow(o.beta1, step);
  const double bc2 = 1.0 - std::pow(o.beta2, step);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1.0 - o.lr * wd;
    m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g[i];
    v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g[i] * g[i];
    const double m_hat = m[i] / bc1;
    const double v_hat = v[i] / bc2;
    p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
  }
}

void expect_matches_reference(DType dtype, double tol) {
  const AdamWOptions options{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.3};
  Tensor w = param({3, 4}, dtype, 1);
  Tensor b = param({4}, dtype, 2);
  AdamW opt({{"layer.weight", w}, {"layer.bias", b}}, options);
  std::vector<double> rw = w.to_vector<double>(), rb = b.to_vector<double>();
  std::vector<double> mw(12), vw(12), mb(4), vb(4);
  for (int step = 1; step <= 5; ++step) {
    // Gradients of varying sign and size; one step has a zero gradient for the bias.
    Tensor gw = testing::random_tensor({3, 4}, dtype, 100 + step, -2.0, 2.0);
    Tensor gb = step == 3 ? zeros({4}, {.dtype = dtype}) : testing::random_tensor({4}, dtype, 200 + step);
    w.set_grad(gw);
    b.set_grad(gb);
    opt.set_lr(options.lr);
    opt.step();
    reference_adamw(rw, mw, vw, gw.to_vector<double>(), options, options.weight_decay, step);
    reference_adamw(rb, mb, vb, gb.to_vector<double>(), options, 0.0, step);  // 1-D: no decay
    ASSERT_TRUE(testing::all_close(w, from_vector(rw, {3, 4}), tol, tol)) << "step " << step;
    ASSERT_TRUE(testing::all_close(b, from_vector(rb, {4}), tol, tol)) << "step " << step;
  }
  EXPECT_EQ(opt.step_count(), 5);
  const NamedTensors state = opt.state_tensors();
  ASSERT_EQ(state.size(), 4u);
  EXPECT_EQ(state[0].first, "exp_avg.layer.weight");
  EXPECT_EQ(state[3].first, "exp_avg_sq.layer.bias");
  EXPECT_TRUE(testing::all_close(state[0].second, from_vector(mw, {3, 4}), tol, tol));
  EXPECT_TRUE(testing::all_close(state[3].second, from_vector(vb, {4}), tol, tol));
}

TEST(AdamW, MatchesReferenceOverSeveralStepsInF64) { expect_matches_reference(DType::f64, 1e-12); }
TEST(AdamW, MatchesReferenceOverSeveralStepsInF32) { expect_matches_reference(DType::f32, 1e-5); }

TEST(AdamW, Bf16ParameterKeepsF32StateAndRoundsOnce) {
  Tensor w = param({8}, DType::bf16, 3);
  AdamW opt({{"w", w}}, {.lr = 0.01, .weight_decay = 0.0});
  EXPECT_EQ(opt.state_tensors()[0].second.dtype(), DType::f32);
  const std::vector<double> before = w.to_vector<double>();
  w.set_grad(full({8}, 1.0, {.dtype = DType::bf16}));
  opt.step();
  // First step with a constant gradient moves every entry by lr * g / (|g| + eps) ~= lr.
  const std::vector<double> after = w.to_vector<double>();
  for (size_t i = 0; i < after.size(); ++i) {
    const double expected = static_cast<double>(bfloat16(static_cast<float>(before[i] - 0.01)));
    EXPECT_NEAR(after[i], expected, 1e-2 * std::abs(expected) + 1e-6) << i;
  }
  EXPECT_TRUE(testing::all_close(opt.state_tensors()[0].second, full({8}, 0.1, {.dtype = DType::f32}), 1e-7));
}

TEST(AdamW, ParamsWithoutGradientAreSkippedIncludingDecay) {
  Tensor w = param({2, 2}, DType::f64, 4);
  Tensor u = param({2, 2}, DType::f64, 5);
  const std::vector<double> u_before = u.to_vector<double>();
  AdamW opt({{"w", w}, {"u", u}}, {.lr = 0.1, .weight_decay = 0.5});
  w.set_grad(ones({2, 2}, {.dtype = DType::f64}));
  opt.step();
  EXPECT_EQ(u.to_vector<double>(), u_before);
  EXPECT_TRUE(testing::all_close(opt.state_tensors()[1].second, zeros({2, 2}, {.dtype = DType::f64})));
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

TEST(AdamW, WeightDecayGroupsExemptNormsBiasesEmbeddingsAndVectors) {
  const NamedTensors params = {{"blocks.0.attn.q.weight", param({4, 4}, DType::f32, 1)},
                               {"blocks.0.attn.q.bias", param({4}, DType::f32, 2)},
                               {"blocks.0.ln_1.scale", param({4}, DType::f32, 3)},
                               {"blocks.0.norm.weight", param({4, 4}, DType::f32, 4)},
                               {"tok_embed.weight", param({10, 4}, DType::f32, 5)},
                               {"head.Bias2d", param({4, 4}, DType::f32, 6)},
                               {"head.weight", param({4, 10}, DType::f32, 7)}};
  AdamW opt(params, {.weight_decay = 0.1});
  const auto& groups = opt.param_groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].name, "decay");
  EXPECT_DOUBLE_EQ(groups[0].weight_decay, 0.1);
  ASSERT_EQ(groups[0].params.size(), 2u);
  EXPECT_EQ(groups[0].params[0].first, "blocks.0.attn.q.weight");
  EXPECT_EQ(groups[0].params[1].first, "head.weight");
  EXPECT_EQ(groups[1].name, "no_decay");
  EXPECT_DOUBLE_EQ(groups[1].weight_decay, 0.0);
  EXPECT_EQ(groups[1].params.size(), 5u);

  AdamW all(params, {.weight_decay = 0.1, .decay_all = true});
  ASSERT_EQ(all.param_groups().size(), 1u);
  EXPECT_EQ(all.param_groups()[0].params.size(), params.size());
}

TEST(AdamW, DecayOnlyChangesDecayedGroupWhenGradientIsZero) {
  // With g = 0 the moments stay 0, so the only change is p *= (1 - lr * wd) on the decayed group.
  Tensor w = param({2, 3}, DType::f64, 8);
  Tensor b = param({3}, DType::f64, 9);
  const std::vector<double> w0 = w.to_vector<double>(), b0 = b.to_vector<double>();
  AdamW opt({{"w", w}, {"b", b}}, {.lr = 0.1, .weight_decay = 0.5});
  w.set_grad(zeros({2, 3}, {.dtype = DType::f64}));
  b.set_grad(zeros({3}, {.dtype = DType::f64}));
  opt.step();
  for (size_t i = 0; i < w0.size(); ++i) EXPECT_NEAR(w.to_vector<double>()[i], w0[i] * 0.95, 1e-15);
  EXPECT_EQ(b.to_vector<double>(), b0);
}

TEST(AdamW, RejectsInvalidOptions) {
  const NamedTensors params = {{"w", param({2}, DType::f32, 1)}};
  EXPECT_CPF_ERROR(AdamW(params, {.lr = -1.0}), "adamw: lr must be finite and >= 0, got -1");
  EXPECT_CPF_ERROR(AdamW(params, {.lr = NAN}), "adamw: lr must be finite and >= 0");
  EXPECT_CPF_ERROR(AdamW(params, {.beta1 = 1.0}), "adamw: beta1 must be in [0, 1), got 1");
  EXPECT_CPF_ERROR(AdamW(params, {.beta1 = -0.1}), "adamw: beta1 must be in [0, 1), got -0.1");
  EXPECT_CPF_ERROR(AdamW(params, {.beta2 = 1.5}), "adamw: beta2 must be in [0, 1), got 1.5");
  EXPECT_CPF_ERROR(AdamW(params, {.eps = 0.0}), "adamw: eps must be finite and > 0, got 0");
  EXPECT_CPF_ERROR(AdamW(params, {.weight_decay = -0.01}), "adamw: weight_decay must be finite and >= 0, got -0.01");
  AdamW opt(params, {});
  EXPECT_CPF_ERROR(opt.set_lr(-0.5), "adamw: lr must be finite and >= 0, got -0.5");
  EXPECT_CPF_ERROR(opt.set_lr(INFINITY), "adamw: lr must be finite and >= 0, got inf");
}

TEST(AdamW, RejectsInvalidParameters) {
  Tensor w = param({2}, DType::f32, 1);
  EXPECT_CPF_ERROR(AdamW(NamedTensors{}, {}), "adamw: no parameters to optimize");
  EXPECT_CPF_ERROR(AdamW(NamedTensors{{"w", Tensor()}}, {}), "weight_decay_groups: parameter 'w' is an undefined");
  EXPECT_CPF_ERROR(AdamW(NamedTensors{{"w", w}, {"w", param({2}, DType::f32, 2)}}, {}),
                   "adamw: parameter name 'w' appears more than once");
  EXPECT_CPF_ERROR(AdamW(NamedTensors{{"w", w}, {"v", w}}, {}),
                   "adamw: parameter 'v' is the same tensor as an earlier parameter");
  EXPECT_CPF_ERROR(AdamW(NamedTensors{{"c", zeros({2})}}, {}),
                   "adamw: parameter 'c' must be a leaf that requires grad");
  EXPECT_CPF_ERROR(AdamW(NamedTensors{{"i", zeros({2}, {.dtype = DType::i64})}}, {}),
                   "adamw: parameter 'i' has dtype i64");
  EXPECT_CPF_ERROR(AdamW(NamedTensors{{"", w}}, {}), "adamw: a parameter of group 'no_decay' has an empty name");
  std::vector<optim::ParamGroup> groups = {{.name = "g", .params = {{"w", w}}, .weight_decay = -1.0}};
  EXPECT_CPF_ERROR(AdamW(groups, {}), "adamw: weight_decay of group 'g' must be finite and >= 0, got -1");
}

TEST(AdamW, StepRejectsMismatchedGradientBeforeChangingAnything) {
  Tensor w = param({2}, DType::f32, 1);
  Tensor v = param({3}, DType::f32, 2);
  AdamW opt({{"w", w}, {"v", v}}, {});
  const std::vector<float> w0 = w.to_vector<float>();
  w.set_grad(ones({2}));
  v.impl()->grad = ones({3}, {.dtype = DType::f64});  // set_grad checks shape only; dtype slips through
  EXPECT_CPF_ERROR(opt.step(), "adamw: gradient of 'v' is f64 but the parameter is f32");
  v.impl()->grad = ones({4});
  EXPECT_CPF_ERROR(opt.step(), "adamw: gradient of 'v' has shape [4] but the parameter has shape [3]");
  EXPECT_EQ(w.to_vector<float>(), w0);
  EXPECT_EQ(opt.step_count(), 0);
}

TEST(AdamW, LoadStateValidatesThenCopiesIntoExistingStorage) {
  Tensor w = param({2, 2}, DType::f32, 1);
  Tensor b = param({2}, DType::f32, 2);
  AdamW source({{"w", w}, {"b", b}}, {});
  w.set_grad(ones({2, 2}));
  b.set_grad(ones({2}));
  source.step();
  source.step();

  AdamW target({{"w", param({2, 2}, DType::f32, 3)}, {"b", param({2}, DType::f32, 4)}}, {});
  const NamedTensors live = target.state_tensors();
  const void* storage_before = live[0].second.raw_data();
  target.load_state(source.state_tensors(), source.step_count());
  EXPECT_EQ(target.step_count(), 2);
  EXPECT_EQ(target.state_tensors()[0].second.raw_data(), storage_before);
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_TRUE(testing::all_close(live[i].second, source.state_tensors()[i].second, 0, 0)) << live[i].first;
  }

  NamedTensors bad = source.state_tensors();
  bad.pop_back();
  EXPECT_CPF_ERROR(target.load_state(bad, 1), "adamw: state tensor 'exp_avg_sq.b' is missing (3 given, 4 expected)");
  bad = source.state_tensors();
  bad[1].second = zeros({3});
  EXPECT_CPF_ERROR(target.load_state(bad, 1),
                   "adamw: state tensor 'exp_avg.b' has shape [3] but the optimizer expects [2]");
  bad[1].second = zeros({2}, {.dtype = DType::f64});
  EXPECT_CPF_ERROR(target.load_state(bad, 1), "adamw: state tensor 'exp_avg.b' is f64 but the optimizer keeps f32");
  bad = source.state_tensors();
  bad[0].second = Tensor();
  EXPECT_CPF_ERROR(target.load_state(bad, 1), "adamw: state tensor 'exp_avg.w' is undefined");
  bad = source.state_tensors();
  bad.emplace_back("exp_avg.extra", zeros({1}));
  EXPECT_CPF_ERROR(target.load_state(bad, 1), "adamw: unexpected state tensor 'exp_avg.extra'");
  bad = source.state_tensors();
  bad.push_back(bad[0]);
  EXPECT_CPF_ERROR(target.load_state(bad, 1), "adamw: state tensor 'exp_avg.w' is given more than once");
  EXPECT_CPF_ERROR(target.load_state(source.state_tensors(), -1), "adamw: step count must be >= 0, got -1");
  EXPECT_EQ(target.step_count(), 2);  // failed loads changed nothing
}

}  // namespace
}  // namespace cpf
