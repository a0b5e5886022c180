#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/optim/grad_clip.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using optim::NamedTensors;

// Parameters with gradients (1, 2, 2) and (4) -> norm sqrt(1 + 4 + 4 + 16) = 5; "c" has no gradient.
NamedTensors three_params(DType dtype) {
  NamedTensors params = {
      {"a", zeros({3}, {.dtype = dtype})}, {"b", zeros({1, 1}, {.dtype = dtype})}, {"c", zeros({2}, {.dtype = dtype})}};
  for (auto& [name, p] : params) p.set_requires_grad(true);
  params[0].second.set_grad(from_vector<double>({1, 2, -2}, {3}));
  params[1].second.set_grad(from_vector<double>({4}, {1, 1}));
  if (dtype != DType::f64) {
    params[0].second.set_grad(raw::to(params[0].second.grad(), dtype));
    params[1].second.set_grad(raw::to(params[1].second.grad(), dtype));
  }
  return params;
}

TEST(GradClip, NormIsGlobalL2AndSkipsMissingGradients) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    EXPECT_DOUBLE_EQ(optim::grad_norm(three_params(dtype)), 5.0) << dtype;
  }
  NamedTensors params = three_params(DType::f64);
  std::vector<Tensor> handles;
  for (auto& [name, p] : params) handles.push_back(p);
  EXPECT_DOUBLE_EQ(optim::grad_norm(handles), 5.0);
}

TEST(GradClip, NormAccumulatesInF64) {
  // 2^20 f32 gradients of 1e-4 plus one of 1: an f32 running sum of squares would lose the small terms.
  Tensor big = zeros({1 << 20});
  big.set_requires_grad(true);
  big.set_grad(full({1 << 20}, 1e-4));
  Tensor one = zeros({1});
  one.set_requires_grad(true);
  one.set_grad(ones({1}));
  const double expected_sq = 1.0 + double(1 << 20) * double(1e-4f) * double(1e-4f);
  EXPECT_NEAR(optim::grad_norm(NamedTensors{{"one", one}, {"big", big}}), std::sqrt(expected_sq), 1e-12);
}

TEST(GradClip, ScalesAboveThresholdAndReturnsPreClipNorm) {
  NamedTensors params = three_params(DType::f64);
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(params, 1.0), 5.0);
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_TRUE(
      testing::all_close(params[0].second.grad(), from_vector<double>({coef, 2 * coef, -2 * coef}, {3}), 1e-15));
  EXPECT_TRUE(testing::all_close(params[1].second.grad(), from_vector<double>({4 * coef}, {1, 1}), 1e-15));
  EXPECT_FALSE(params[2].second.grad().defined());
  EXPECT_NEAR(optim::grad_norm(params), 1.0, 1e-6);
}

TEST(GradClip, NoOpAtOrBelowThreshold) {
  NamedTensors params = three_params(DType::f32);
  const uint64_t version = params[0].second.grad().version();
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(params, 5.0), 5.0);
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(params, 100.0), 5.0);
  EXPECT_EQ(params[0].second.grad().version(), version);
  EXPECT_EQ(params[0].second.grad().to_vector<float>(), (std::vector<float>{1, 2, -2}));
}

TEST(GradClip, NonFiniteNormIsReportedWithoutTouchingGradients) {
  for (double bad : {double(INFINITY), double(NAN)}) {
    NamedTensors params = three_params(DType::f32);
    params[1].second.set_grad(full({1, 1}, bad));
    const double norm = optim::clip_grad_norm_(params, 1.0);
    EXPECT_FALSE(std::isfinite(norm));
    EXPECT_EQ(std::isnan(norm), std::isnan(bad));
    EXPECT_EQ(params[0].second.grad().to_vector<float>(), (std::vector<float>{1, 2, -2}));
  }
}

TEST(GradClip, NoGradientsGiveZeroNorm) {
  Tensor p = zeros({2});
  p.set_requires_grad(true);
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(NamedTensors{{"p", p}}, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(optim::grad_norm(std::vector<Tensor>{}), 0.0);
}

TEST(GradClip, ScaleGradsForAccumulation) {
  NamedTensors params = three_params(DType::f64);
  optim::scale_grads_(params, 0.25);
  EXPECT_EQ(params[0].second.grad().to_vector<double>(), (std::vector<double>{0.25, 0.5, -0.5}));
  EXPECT_DOUBLE_EQ(optim::grad_norm(params), 1.25);
}

TEST(GradClip, AccumulatedScaledMicroBatchesEqualTheFullBatchGradient) {
  // Mean loss over 4 samples == sum over 2 micro-batches of (micro-batch mean / 2).
  Tensor x = testing::random_tensor({4, 3}, DType::f64, 5);
  Tensor w = testing::grad_input({3}, 6);
  backward(mean(mul(sum(mul(x, w), {1}), sum(mul(x, w), {1}))));
  const Tensor full_grad = raw::clone(w.grad());
  w.set_grad(Tensor());
  for (int64_t m = 0; m < 2; ++m) {
    Tensor xm = narrow(x, 0, 2 * m, 2);
    Tensor y = sum(mul(xm, w), {1});
    backward(mean(mul(y, y)));
  }
  optim::scale_grads_(NamedTensors{{"w", w}}, 0.5);
  EXPECT_TRUE(testing::all_close(w.grad(), full_grad, 1e-14));
}

TEST(GradClip, RejectsInvalidArguments) {
  NamedTensors params = three_params(DType::f32);
  EXPECT_CPF_ERROR(optim::clip_grad_norm_(params, 0.0), "clip_grad_norm_: max_norm must be finite and > 0, got 0");
  EXPECT_CPF_ERROR(optim::clip_grad_norm_(params, -1.0), "clip_grad_norm_: max_norm must be finite and > 0, got -1");
  EXPECT_CPF_ERROR(optim::clip_grad_norm_(params, NAN), "clip_grad_norm_: max_norm must be finite and > 0, got nan");
  EXPECT_CPF_ERROR(optim::scale_grads_(params, INFINITY), "scale_grads_: factor must be finite, got inf");
  EXPECT_CPF_ERROR(optim::grad_norm(NamedTensors{{"u", Tensor()}}),
                   "gradient utilities: parameter 'u' is an undefined");
  EXPECT_CPF_ERROR(optim::grad_norm(std::vector<Tensor>{Tensor()}), "grad_norm: parameter 0 is an undefined tensor");
  params[1].second.impl()->grad = zeros({1, 1}, {.dtype = DType::i32});  // set_grad does not check dtypes
  EXPECT_CPF_ERROR(optim::clip_grad_norm_(params, 1.0), "clip_grad_norm_: gradient of parameter 1 has dtype i32");
}

}  // namespace
}  // namespace cpf
