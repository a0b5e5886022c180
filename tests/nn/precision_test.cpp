// Mixed precision in the modules (framework/nn/precision.h): f32 parameters used by bf16 inputs are
// cast per use with a differentiable cast, so outputs are bf16 while every gradient that reaches a
// parameter is f32; mismatches other than f32 -> bf16 are errors naming both dtypes. Also Module::to,
// which moves parameters in place (the handles the modules and optimizers hold stay valid).
#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "framework/nn/mlp.h"
#include "framework/nn/precision.h"
#include "framework/nn/rms_norm.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/storage.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::random_tensor;

Tensor f32_input(const Shape& shape, uint64_t seed) {
  return raw::to(random_tensor(shape, DType::f64, seed), DType::f32);
}

// Max |a - b| / max |b| over all elements.
double rel_max_error(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>();
  const auto y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    err = std::max(err, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return scale == 0 ? err : err / scale;
}

// bf16 keeps 8 significant bits: inputs and weights round by up to 2^-9 relative, the op rounds its
// result once more; with sums of 16-32 terms of mixed sign the error relative to the largest
// element stays below a few 2^-8. 2e-2 is that bound with margin, far below a wrong formula.
constexpr double kBf16Rtol = 2e-2;

TEST(Precision, LinearCastsF32WeightsToABf16InputAndReturnsF32Gradients) {
  nn::Linear linear({.in_features = 16, .out_features = 8, .bias = true, .init_std = 0.3});
  {
    NoGradGuard no_grad;  // a non-zero bias so its path is checked too
    raw::copy_(linear.bias(), f32_input({8}, 9));
  }
  const Tensor x32 = f32_input({5, 16}, 1);
  const Tensor y32 = linear.forward(x32);  // (5, 8) f32 reference
  backward(sum(mul(y32, y32)));
  const Tensor gw32 = raw::clone(linear.weight().grad()), gb32 = raw::clone(linear.bias().grad());
  linear.zero_grad();

  const Tensor y16 = linear.forward(raw::to(x32, DType::bf16));  // (5, 8) bf16
  EXPECT_EQ(y16.dtype(), DType::bf16);
  EXPECT_LE(rel_max_error(y16, y32), kBf16Rtol);
  backward(sum(mul(to(y16, DType::f32), to(y16, DType::f32))));
  // The master weights stay f32 and receive f32 gradients close to the f32 run's.
  EXPECT_EQ(linear.weight().dtype(), DType::f32);
  ASSERT_TRUE(linear.weight().grad().defined());
  EXPECT_EQ(linear.weight().grad().dtype(), DType::f32);
  EXPECT_EQ(linear.bias().grad().dtype(), DType::f32);
  EXPECT_LE(rel_max_error(linear.weight().grad(), gw32), 2 * kBf16Rtol);
  EXPECT_LE(rel_max_error(linear.bias().grad(), gb32), 2 * kBf16Rtol);
}

TEST(Precision, NormsAndMlpFollowTheirInputDtype) {
  const Tensor x32 = f32_input({6, 32}, 2);
  const Tensor x16 = raw::to(x32, DType::bf16);
  nn::RMSNorm rms({.dim = 32});
  nn::LayerNorm ln({.dim = 32, .bias = true});
  nn::MLP mlp({.hidden_size = 32, .intermediate_size = 64, .activation = nn::Activation::swiglu, .init_std = 0.1});
  Generator gen(3);
  const Tensor r16 = rms.forward(x16), l16 = ln.forward(x16), m16 = mlp.forward(x16);
  EXPECT_EQ(r16.dtype(), DType::bf16);
  EXPECT_EQ(l16.dtype(), DType::bf16);
  EXPECT_EQ(m16.dtype(), DType::bf16);
  EXPECT_LE(rel_max_error(r16, rms.forward(x32)), kBf16Rtol);
  EXPECT_LE(rel_max_error(l16, ln.forward(x32)), kBf16Rtol);
  EXPECT_LE(rel_max_error(m16, mlp.forward(x32)), kBf16Rtol);
  backward(add(add(sum(to(r16, DType::f32)), sum(to(l16, DType::f32))), sum(to(m16, DType::f32))));
  for (const nn::Module* m : std::initializer_list<const nn::Module*>{&rms, &ln, &mlp}) {
    for (const auto& [name, p] : m->named_parameters()) {
      EXPECT_EQ(p.dtype(), DType::f32) << name;
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().dtype(), DType::f32) << name;
    }
  }
}

TEST(Precision, OtherDtypeMismatchesAreErrorsNamingBoth) {
  nn::Linear linear({.in_features = 4, .out_features = 2});
  EXPECT_CPF_ERROR(linear.forward(zeros({3, 4}, {.dtype = DType::f64})),
                   "Linear: input dtype f64 does not match the weight dtype f32");
  nn::Linear wide({.in_features = 4, .out_features = 2, .dtype = DType::f64});
  EXPECT_CPF_ERROR(wide.forward(zeros({3, 4}, {.dtype = DType::bf16})),
                   "Linear: input dtype bf16 does not match the weight dtype f64 (mixed precision narrows f32");
  nn::RMSNorm rms({.dim = 4});
  EXPECT_CPF_ERROR(rms.forward(zeros({3, 4}, {.dtype = DType::f64})),
                   "RMSNorm: input dtype f64 does not match the weight dtype f32");
  nn::LayerNorm ln({.dim = 4});
  EXPECT_CPF_ERROR(ln.forward(zeros({3, 4}, {.dtype = DType::f64})),
                   "LayerNorm: input dtype f64 does not match the weight dtype f32");
}

TEST(Precision, PolicyConvertsBetweenParameterAndComputeDtypes) {
  const nn::Precision mixed{.param = DType::f32, .compute = DType::bf16};
  EXPECT_TRUE(mixed.mixed());
  const Tensor x = f32_input({3, 4}, 4);
  const Tensor c = mixed.to_compute(x);
  EXPECT_EQ(c.dtype(), DType::bf16);
  EXPECT_EQ(mixed.to_param(c).dtype(), DType::f32);
  EXPECT_TRUE(mixed.to_param(x).is_same(x));  // no copy when already there
  const nn::Precision plain{};
  EXPECT_FALSE(plain.mixed());
  EXPECT_TRUE(plain.to_compute(x).is_same(x));
  // The cast is differentiable: the gradient comes back in the input's dtype.
  Tensor leaf = x.detach();
  leaf.set_requires_grad(true);
  backward(sum(to(mixed.to_compute(leaf), DType::f32)));
  EXPECT_EQ(leaf.grad().dtype(), DType::f32);
  EXPECT_EQ(nn::precision_name(DType::bf16), "bf16");
  EXPECT_EQ(nn::precision_name(DType::f32), "fp32");
}

TEST(Precision, UnsupportedPairsAreRejected) {
  nn::check_precision({.param = DType::f32, .compute = DType::bf16}, "test");
  nn::check_precision({.param = DType::f64, .compute = DType::f64}, "test");
  EXPECT_CPF_ERROR(nn::check_precision({.param = DType::bf16, .compute = DType::bf16}, "GPT"),
                   "GPT: parameters must be f32 or f64");
  EXPECT_CPF_ERROR(nn::check_precision({.param = DType::f64, .compute = DType::bf16}, "GPT"),
                   "GPT: compute dtype bf16 with f64 parameters is not supported");
  EXPECT_CPF_ERROR(nn::check_precision({.param = DType::f32, .compute = DType::i64}, "GPT"), "compute floating");
}

TEST(ModuleTo, MovesParametersInPlaceKeepingHandles) {
  nn::Linear linear({.in_features = 3, .out_features = 2});
  const auto before = linear.named_parameters();
  const std::vector<float> values = linear.weight().to_vector<float>();
  linear.to(Device::cpu());  // already there: nothing changes
  EXPECT_TRUE(linear.weight().is_same(before[0].second));
  EXPECT_EQ(linear.weight().to_vector<float>(), values);

  const bool have_gpu = has_device_backend(DeviceType::cuda) && device_backend(DeviceType::cuda).device_count() > 0;
  if (!have_gpu) {
    if (!has_device_backend(DeviceType::cuda)) {
      EXPECT_CPF_ERROR(linear.to(Device::cuda(0)), "cuda");
    }
    GTEST_SKIP() << "no CUDA device is visible: the round trip through cuda:0 runs on the GPU machines";
  }
  backward(sum(linear.forward(ones({1, 3}))));  // a gradient moves with its parameter
  linear.to(Device::cuda(0));
  EXPECT_TRUE(linear.weight().is_same(before[0].second));  // the same TensorImpl, now on the GPU
  EXPECT_EQ(before[0].second.device(), Device::cuda(0));
  EXPECT_EQ(linear.weight().grad().device(), Device::cuda(0));
  EXPECT_EQ(linear.forward(ones({1, 3}, {.device = Device::cuda(0)})).device(), Device::cuda(0));
  linear.to(Device::cpu());
  EXPECT_EQ(linear.weight().to_vector<float>(), values);  // exact copies both ways
}

}  // namespace
}  // namespace cpf
