#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/optim/grad_clip.h"
#include "framework/tensor/ops/elementwise.h"
#include "support/host_as_device.h"
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

// The device-decided variants (grad_sum_squares, clip_grads_by_sum_squares_) on the CPU: the reference
// the CUDA clip kernel is tested against, so it must equal the host-decided clip_grad_norm_ bit for bit.
NamedTensors random_params(DType dtype, uint64_t seed, double scale) {
  NamedTensors params;
  const std::vector<Shape> shapes{{7, 5}, {13}, {1}, {0, 3}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = zeros(shapes[i], {.dtype = dtype});
    p.set_requires_grad(true);
    Tensor g = raw::to(testing::random_tensor(shapes[i], DType::f64, seed + i), dtype);
    raw::mul_(g, scale);
    p.set_grad(g);
    params.emplace_back("p" + std::to_string(i), p);
  }
  return params;
}

std::vector<std::vector<double>> grads_of(const NamedTensors& params) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, p] : params) out.push_back(p.grad().to_vector<double>());
  return out;
}

TEST(GradClip, SumOfSquaresIsTheSquaredNormBitForBit) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    const NamedTensors params = random_params(dtype, 3, 2.0);
    const Tensor sum = optim::grad_sum_squares(params);
    EXPECT_EQ(sum.dtype(), DType::f64);
    EXPECT_EQ(sum.shape(), (Shape{1}));
    EXPECT_EQ(std::sqrt(sum.item<double>()), optim::grad_norm(params)) << dtype;
  }
  EXPECT_EQ(optim::grad_sum_squares(std::vector<Tensor>{}).item<double>(), 0.0);
}

TEST(GradClip, ClipBySumOfSquaresEqualsClipGradNormBitForBit) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (double max_norm : {0.5, 1e9}) {  // clipped, and left alone
      NamedTensors host = random_params(dtype, 7, 3.0), decided = random_params(dtype, 7, 3.0);
      const double norm = optim::clip_grad_norm_(host, max_norm);
      optim::clip_grads_by_sum_squares_(decided, optim::grad_sum_squares(decided), max_norm);
      EXPECT_EQ(grads_of(decided), grads_of(host)) << dtype << " max_norm " << max_norm;
      EXPECT_EQ(norm > max_norm, grads_of(decided) != grads_of(random_params(dtype, 7, 3.0)));
    }
  }
}

TEST(GradClip, ClipBySumOfSquaresLeavesGradientsAloneForANonFiniteSum) {
  for (double bad : {double(INFINITY), double(NAN)}) {
    NamedTensors params = three_params(DType::f32);
    const Tensor sum = full({1}, bad, {.dtype = DType::f64});
    optim::clip_grads_by_sum_squares_(params, sum, 1.0);
    EXPECT_EQ(params[0].second.grad().to_vector<float>(), (std::vector<float>{1, 2, -2}));
    EXPECT_EQ(params[1].second.grad().to_vector<float>(), (std::vector<float>{4}));
  }
}

TEST(GradClip, DeviceDecidedVariantsRejectInvalidArguments) {
  NamedTensors params = three_params(DType::f32);
  const Tensor sum = optim::grad_sum_squares(params);
  EXPECT_DOUBLE_EQ(sum.item<double>(), 25.0);
  EXPECT_CPF_ERROR(optim::clip_grads_by_sum_squares_(params, sum, 0.0),
                   "clip_grads_by_sum_squares_: max_norm must be finite and > 0, got 0");
  EXPECT_CPF_ERROR(optim::clip_grads_by_sum_squares_(params, zeros({1}), 1.0),
                   "clip_grads_by_sum_squares_: sum_squares must be one f64 element (grad_sum_squares' result), "
                   "got f32 of shape [1]");
  EXPECT_CPF_ERROR(optim::clip_grads_by_sum_squares_(params, zeros({2}, {.dtype = DType::f64}), 1.0),
                   "got f64 of shape [2]");
  EXPECT_CPF_ERROR(optim::clip_grads_by_sum_squares_(params, Tensor(), 1.0), "got undefined");
  EXPECT_CPF_ERROR(optim::grad_sum_squares(std::vector<Tensor>{Tensor()}),
                   "grad_sum_squares: parameter 0 is an undefined tensor");
}

TEST(GradClip, DeviceDecidedVariantsRejectMixedDevices) {
  if (has_device_backend(DeviceType::cuda)) GTEST_SKIP() << "a real CUDA backend is registered";
  testing::HostAsDevice backend;
  register_device_backend(DeviceType::cuda, &backend);
  {
    Tensor a = zeros({2});
    a.set_requires_grad(true);
    a.set_grad(ones({2}));
    Tensor b = zeros({2}, {.device = Device::cuda(0)});
    b.set_requires_grad(true);
    EXPECT_CPF_ERROR(optim::grad_sum_squares(std::vector<Tensor>{a, b}),
                     "grad_sum_squares: parameter 1 is on cuda:0 but parameter 0 is on cpu; the sum stays on one "
                     "device (grad_norm adds up several)");
    Tensor c = zeros({2});
    c.set_requires_grad(true);
    c.set_grad(zeros({2}, {.device = Device::cuda(0)}));
    EXPECT_CPF_ERROR(optim::grad_sum_squares(std::vector<Tensor>{a, c}),
                     "grad_sum_squares: a gradient is on cuda:0 but the parameters are on cpu");
    EXPECT_CPF_ERROR(
        optim::clip_grads_by_sum_squares_(std::vector<Tensor>{a, c}, full({1}, 1.0, {.dtype = DType::f64}), 1.0),
        "clip_grads_by_sum_squares_: a gradient is on cuda:0 but sum_squares is on cpu");
  }
  register_device_backend(DeviceType::cuda, nullptr);
}

}  // namespace
}  // namespace cpf
