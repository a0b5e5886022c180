// gradcheck itself: it passes correct ops, catches wrong backward functions (naming the worst
// element), samples subsets, perturbs inputs in place and restores them, and rejects bad inputs.
#include "framework/autograd/gradcheck.h"

#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/node.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"
#include "support/gradcheck_utils.h"
#include "support/test_device.h"

namespace cpf {
namespace {

using testing::grad_input;
using testing::random_tensor;
using Inputs = std::vector<Tensor>;

// x * x with a backward that forgets the factor 2.
Tensor wrong_square(const Tensor& x) {
  auto forgets_the_2 = [sx = autograd::SavedTensor(x)](const autograd::GradList& g) {
    return autograd::GradList{raw::mul(g[0], sx.unpack())};
  };
  return autograd::record("wrong_square", raw::mul(x, x), {x}, forgets_the_2);
}

// a * b whose backward gives b's gradient to a correctly but scales b's by 1.01 (a subtle bug).
Tensor subtly_wrong_mul(const Tensor& a, const Tensor& b) {
  return autograd::record(
      "subtly_wrong_mul", raw::mul(a, b), {a, b},
      [sa = autograd::SavedTensor(a), sb = autograd::SavedTensor(b)](const autograd::GradList& g) {
        return autograd::GradList{raw::mul(g[0], sb.unpack()), raw::mul(raw::mul(g[0], sa.unpack()), 1.01)};
      });
}

TEST(Gradcheck, PassesCorrectOps) {
  Tensor a = grad_input({3, 4}, 1);
  Tensor b = grad_input({4, 2}, 2);
  const GradcheckReport r = gradcheck([](const Inputs& x) { return tanh(matmul(x[0], x[1])); }, Inputs{a, b});
  EXPECT_TRUE(r.ok) << r.str();
  EXPECT_EQ(r.checked, 12 + 8);
  EXPECT_LT(r.max_abs_error, 1e-7);
  EXPECT_EQ(r.str().rfind("gradcheck passed: 20 elements", 0), 0u) << r.str();
  EXPECT_GRADCHECK([](const Inputs& x) { return sum(mul(exp(x[0]), x[0]), {1}); }, Inputs{a});
}

TEST(Gradcheck, FailsOnAWrongBackwardAndNamesTheWorstElement) {
  Tensor x = grad_input({2, 3}, 3, 0.5, 2.0);
  const GradcheckReport r = gradcheck([](const Inputs& in) { return wrong_square(in[0]); }, Inputs{x});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.checked, 6);
  EXPECT_EQ(r.worst_input, 0u);
  EXPECT_EQ(r.worst_shape, (Shape{2, 3}));
  // The analytic gradient left in x.grad() is w * x; the true one is 2 w x. The error relative to the
  // tolerance grows with |w x|, so the worst element is the largest analytic gradient.
  const auto analytic = x.grad().to_vector<double>();
  int64_t expected_worst = 0;
  for (int64_t e = 1; e < 6; ++e) {
    if (std::abs(analytic[e]) > std::abs(analytic[expected_worst])) expected_worst = e;
  }
  EXPECT_EQ(r.worst_index, expected_worst);
  EXPECT_DOUBLE_EQ(r.worst_analytic, analytic[expected_worst]);
  EXPECT_NEAR(r.worst_numeric, 2 * r.worst_analytic, 1e-6);
  EXPECT_NEAR(r.max_abs_error, std::abs(analytic[expected_worst]), 1e-6);
  const std::string s = r.str();
  EXPECT_EQ(s.rfind("gradcheck FAILED: 6 elements", 0), 0u) << s;
  EXPECT_NE(s.find("worst: input 0 [2,3] element " + std::to_string(expected_worst) + " analytic="), std::string::npos)
      << s;
  EXPECT_NE(s.find("numeric="), std::string::npos) << s;
}

TEST(Gradcheck, FindsTheWrongInputAmongSeveral) {
  Tensor a = grad_input({4}, 4);
  Tensor b = grad_input({4}, 5);
  const GradcheckReport r = gradcheck([](const Inputs& in) { return subtly_wrong_mul(in[0], in[1]); }, Inputs{a, b});
  EXPECT_FALSE(r.ok) << r.str();
  EXPECT_EQ(r.worst_input, 1u);
  EXPECT_NEAR(r.worst_analytic, 1.01 * r.worst_numeric, 1e-6);
}

TEST(Gradcheck, FailsWhenAGradientIsMissingOrNaN) {
  Tensor x = grad_input({3}, 6);
  const GradcheckReport missing = gradcheck(
      [](const Inputs& in) {
        return autograd::record("no_grad", raw::mul(in[0], 3.0), {in[0]},
                                [](const autograd::GradList&) { return autograd::GradList{Tensor()}; });
      },
      Inputs{x});
  EXPECT_FALSE(missing.ok);
  EXPECT_EQ(missing.worst_analytic, 0.0);
  const GradcheckReport nan = gradcheck(
      [](const Inputs& in) {
        return autograd::record("nan_grad", raw::mul(in[0], 3.0), {in[0]},
                                [](const autograd::GradList& g) { return autograd::GradList{raw::mul(g[0], NAN)}; });
      },
      Inputs{x});
  EXPECT_FALSE(nan.ok);
  EXPECT_TRUE(std::isnan(nan.worst_analytic));
}

TEST(Gradcheck, RandomSubsetMode) {
  Tensor a = grad_input({10, 10}, 7);
  Tensor b = grad_input({3}, 8);
  GradcheckOptions options;
  options.max_elements_per_input = 5;
  auto fn = [](const Inputs& in) { return add(sum(square(in[0])), sum(in[1])); };
  const GradcheckReport r = gradcheck(fn, Inputs{a, b}, options);
  EXPECT_TRUE(r.ok) << r.str();
  EXPECT_EQ(r.checked, 5 + 3) << "at most 5 per input; smaller inputs are checked whole";
  options.max_elements_per_input = 0;
  EXPECT_EQ(gradcheck(fn, Inputs{a, b}, options).checked, 103);
  // A wrong backward is still caught on a sample.
  options.max_elements_per_input = 4;
  const GradcheckReport bad = gradcheck([](const Inputs& in) { return wrong_square(in[0]); }, Inputs{a}, options);
  EXPECT_FALSE(bad.ok);
  EXPECT_EQ(bad.checked, 4);
  // Different seeds sample different elements; the same seed the same ones.
  options.seed = 1;
  const GradcheckReport s1 = gradcheck([](const Inputs& in) { return wrong_square(in[0]); }, Inputs{a}, options);
  const GradcheckReport s1_again = gradcheck([](const Inputs& in) { return wrong_square(in[0]); }, Inputs{a}, options);
  options.seed = 2;
  const GradcheckReport s2 = gradcheck([](const Inputs& in) { return wrong_square(in[0]); }, Inputs{a}, options);
  EXPECT_EQ(s1.worst_index, s1_again.worst_index);
  EXPECT_EQ(s1.max_abs_error, s1_again.max_abs_error);
  EXPECT_NE(s1.max_abs_error, s2.max_abs_error);
}

TEST(Gradcheck, InputsArePerturbedInPlaceAndRestored) {
  Tensor p = grad_input({2, 3}, 9);
  const auto before = p.to_vector<double>();
  const uint64_t version = p.version();
  // The function reaches the input through a captured handle, like a module parameter.
  EXPECT_GRADCHECK([&p](const Inputs&) { return sum(mul(p, p), {0}); }, Inputs{p});
  EXPECT_EQ(p.to_vector<double>(), before) << "every element restored bit for bit";
  EXPECT_EQ(p.version(), version);
  // A non-contiguous leaf is perturbed through its strides; indices are row-major over the view.
  Tensor t = raw::transpose(random_tensor({3, 2}, DType::f64, 10), 0, 1);
  t.set_requires_grad(true);
  const GradcheckReport r = gradcheck([](const Inputs& in) { return wrong_square(in[0]); }, Inputs{t});
  EXPECT_FALSE(r.ok);
  const auto analytic = t.grad().to_vector<double>();
  int64_t expected_worst = 0;
  for (int64_t e = 1; e < 6; ++e) {
    if (std::abs(analytic[e]) > std::abs(analytic[expected_worst])) expected_worst = e;
  }
  EXPECT_EQ(r.worst_index, expected_worst);
  EXPECT_NEAR(r.worst_numeric, 2 * r.worst_analytic, 1e-6);
}

TEST(Gradcheck, ConstantInputsAndSeveralOutputs) {
  Tensor x = grad_input({2, 3}, 11);
  Tensor c = random_tensor({2, 3}, DType::f64, 12);       // held constant
  Tensor f32_const = random_tensor({3}, DType::f32, 13);  // constants may have any dtype
  const GradcheckFn fn = [](const Inputs& in) {
    Tensor y = mul(in[0], in[1]);
    return std::vector<Tensor>{sum(y, {1}), exp(in[0]), argmax(y, 1), Tensor(), mul(to(in[2], DType::f64), 2.0)};
  };
  const GradcheckReport r = gradcheck(fn, Inputs{x, c, f32_const});
  EXPECT_TRUE(r.ok) << r.str();
  EXPECT_EQ(r.checked, 6);
  EXPECT_FALSE(c.grad().defined());
}

TEST(Gradcheck, RejectsBadInputs) {
  auto fn = [](const Inputs& in) { return sum(in[0]); };
  Tensor f = zeros({2}, {.requires_grad = true});
  EXPECT_CPF_ERROR(gradcheck(fn, Inputs{f}),
                   "gradcheck: input 0 of shape [2] is f32; finite differences need f64 inputs");
  Tensor plain = zeros({2}, {.dtype = DType::f64});
  EXPECT_CPF_ERROR(gradcheck(fn, Inputs{plain}),
                   "gradcheck: no input requires grad; call set_requires_grad() on the inputs to check");
  EXPECT_CPF_ERROR(gradcheck(fn, Inputs{}), "gradcheck: no input requires grad");
  GradcheckOptions options;
  options.eps = 0;
  EXPECT_CPF_ERROR(gradcheck(fn, Inputs{grad_input({2})}, options), "gradcheck: eps must be positive, got 0");
  Tensor expanded = raw::expand(zeros({1, 2}, {.dtype = DType::f64}), {3, 2});
  expanded.set_requires_grad(true);
  EXPECT_CPF_ERROR(gradcheck(fn, Inputs{expanded}),
                   "gradcheck: input 0 of shape [3,2] has overlapping elements (stride 0 at dim 0); pass a contiguous "
                   "copy");
  Tensor bf = zeros({2}, {.dtype = DType::bf16, .requires_grad = true});
  EXPECT_CPF_ERROR(gradcheck(fn, Inputs{grad_input({2}), bf}), "gradcheck: input 1 of shape [2] is bf16");
}

// gradcheck itself on every device: a device input is perturbed where it lives (finite differences run
// the device's kernels), restored bit for bit, and a wrong backward is still caught.
class GradcheckOnDevice : public testing::DeviceTest {};

TEST_P(GradcheckOnDevice, PassesCorrectOpsAndCatchesAWrongBackward) {
  Tensor a = grad_leaf({3, 4}, 1);
  Tensor b = grad_leaf({4, 2}, 2);
  const GradcheckReport r = gradcheck([](const Inputs& x) { return tanh(matmul(x[0], x[1])); }, Inputs{a, b});
  EXPECT_TRUE(r.ok) << r.str();
  EXPECT_EQ(r.checked, 12 + 8);
  EXPECT_LT(r.max_abs_error, 1e-7);
  EXPECT_EQ(a.grad().device(), device());
  Tensor x = grad_leaf({2, 3}, 3, 0.5, 2.0);
  const GradcheckReport wrong = gradcheck([](const Inputs& in) { return wrong_square(in[0]); }, Inputs{x});
  EXPECT_FALSE(wrong.ok) << wrong.str();
  EXPECT_NEAR(wrong.worst_numeric, 2 * wrong.worst_analytic, 1e-6) << wrong.str();
}

TEST_P(GradcheckOnDevice, StridedInputsArePerturbedInPlaceAndRestored) {
  Tensor t = strided_leaf(2, 3, 10);  // (2, 3) view of a (3, 2) tensor
  const auto before = t.to_vector<double>();
  const uint64_t version = t.version();
  EXPECT_GRADCHECK([](const Inputs& in) { return mul(exp(in[0]), in[0]); }, Inputs{t});
  EXPECT_EQ(t.to_vector<double>(), before) << "every element restored bit for bit";
  EXPECT_EQ(t.version(), version);
  // Indices of the worst element are row-major over the view, as on the CPU.
  const GradcheckReport r = gradcheck([](const Inputs& in) { return wrong_square(in[0]); }, Inputs{t});
  EXPECT_FALSE(r.ok);
  const auto analytic = t.grad().to_vector<double>();
  int64_t expected_worst = 0;
  for (int64_t e = 1; e < 6; ++e) {
    if (std::abs(analytic[e]) > std::abs(analytic[expected_worst])) expected_worst = e;
  }
  EXPECT_EQ(r.worst_index, expected_worst);
  EXPECT_NEAR(r.worst_numeric, 2 * r.worst_analytic, 1e-6);
}

TEST_P(GradcheckOnDevice, SeveralOutputsWithConstants) {
  Tensor x = grad_leaf({2, 3}, 11);
  Tensor c = constant({2, 3}, 12);
  const GradcheckFn fn = [](const Inputs& in) {
    Tensor y = mul(in[0], in[1]);
    return std::vector<Tensor>{sum(y, {1}), exp(in[0]), argmax(y, 1), Tensor()};
  };
  const GradcheckReport r = gradcheck(fn, Inputs{x, c});
  EXPECT_TRUE(r.ok) << r.str();
  EXPECT_EQ(r.checked, 6);
  EXPECT_FALSE(c.grad().defined());
}

CPF_INSTANTIATE_DEVICE_SUITE(GradcheckOnDevice);

}  // namespace
}  // namespace cpf
