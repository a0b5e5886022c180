// The linear ops of framework/autograd/functions/linear.h on the CPU: f64 gradchecks of linear,
// linear_gelu and gelu_mlp (bias on/off, leading dims 1-3), the mixed-precision contract (f32 master
// weights of a bf16 input get f32 gradients computed from the bf16 operands without a bf16 rounding
// step; compute_weight is used and not differentiated) and the rejected inputs. The device runs of
// the same ops are the op cases (op_cases_nn.h) and tests/tensor/cuda/linear_epilogue_test.cpp.
#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "support/gradcheck_utils.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::grad_input;
using testing::random_tensor;
using Inputs = std::vector<Tensor>;

Shape with_rows(Shape lead, int64_t last) {
  lead.push_back(last);
  return lead;
}

TEST(LinearOpsGradcheck, LinearLinearGeluAndGeluMlp) {
  const std::vector<Shape> leads{{5}, {2, 3}, {2, 1, 3}};
  uint64_t seed = 1;
  for (const auto& lead : leads) {
    const Tensor x = grad_input(with_rows(lead, 4), seed++);
    const Tensor w1 = grad_input({6, 4}, seed++), b1 = grad_input({6}, seed++);
    const Tensor w2 = grad_input({3, 6}, seed++), b2 = grad_input({3}, seed++);
    EXPECT_GRADCHECK([](const Inputs& in) { return linear(in[0], in[1], in[2]); }, Inputs{x, w1, b1});
    EXPECT_GRADCHECK([](const Inputs& in) { return linear(in[0], in[1]); }, Inputs{x, w1});
    EXPECT_GRADCHECK([](const Inputs& in) { return linear_gelu(in[0], in[1], in[2]); }, Inputs{x, w1, b1});
    EXPECT_GRADCHECK([](const Inputs& in) { return linear_gelu(in[0], in[1]); }, Inputs{x, w1});
    EXPECT_GRADCHECK(
        [](const Inputs& in) {
          return gelu_mlp(in[0], {in[1], in[2]}, {in[3], in[4]});
        },
        Inputs{x, w1, b1, w2, b2});
    EXPECT_GRADCHECK([](const Inputs& in) { return gelu_mlp(in[0], {in[1]}, {in[2]}); }, Inputs{x, w1, w2});
  }
}

// linear_gelu and gelu_mlp compute exactly the unfused composition on the CPU.
TEST(LinearOps, FusedOpsEqualTheirComposition) {
  const Tensor x = random_tensor({2, 3, 4}, DType::f32, 1);
  const Tensor w1 = random_tensor({8, 4}, DType::f32, 2), b1 = random_tensor({8}, DType::f32, 3);
  const Tensor w2 = random_tensor({4, 8}, DType::f32, 4), b2 = random_tensor({4}, DType::f32, 5);
  const Tensor h = gelu(linear(x, w1, b1));
  EXPECT_TRUE(testing::all_close(linear_gelu(x, w1, b1), h, 0, 0));
  EXPECT_TRUE(testing::all_close(gelu_mlp(x, {w1, b1}, {w2, b2}), linear(h, w2, b2), 0, 0));
}

// The gradient of an f32 master weight used by a bf16 input: dW = dY^T X over the bf16 values with f32
// accumulation, not a bf16 product widened afterwards. Compared with the f64 product of the same
// bf16 values: the f32 accumulation is within f32 rounding of it, a bf16 rounding step (relative
// error up to 2^-9) would not be.
TEST(LinearOps, MixedPrecisionGradientsAreF32FromBf16Operands) {
  const Tensor x = raw::to(random_tensor({2, 16, 24}, DType::f32, 7), DType::bf16);  // (B, T, K)
  Tensor w = random_tensor({12, 24}, DType::f32, 8).set_requires_grad(true);         // (N, K) master
  Tensor b = random_tensor({12}, DType::f32, 9).set_requires_grad(true);
  const Tensor gy = raw::to(random_tensor({2, 16, 12}, DType::f32, 10), DType::bf16);  // (B, T, N)
  for (const bool fused_mlp : {false, true}) {
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    Tensor y = fused_mlp ? linear_gelu(x, w, b) : linear(x, w, b);
    ASSERT_EQ(y.dtype(), DType::bf16);
    backward(y, gy);
    ASSERT_EQ(w.grad().dtype(), DType::f32);
    ASSERT_EQ(b.grad().dtype(), DType::f32);
    // The gradient at the pre-activation, as the op rounds it (bf16), for the GELU case.
    Tensor g = gy;
    if (fused_mlp) {
      const Tensor pre = raw::linear(x, raw::to(w, DType::bf16), raw::to(b, DType::bf16));
      g = raw::unary_backward(raw::UnaryOp::gelu, gy, pre, pre);
    }
    const Tensor g64 = raw::reshape(raw::to(g, DType::f64), {32, 12});
    const Tensor x64 = raw::reshape(raw::to(x, DType::f64), {32, 24});
    EXPECT_TRUE(testing::all_close(w.grad(), raw::matmul(raw::transpose(g64, 0, 1), x64), 1e-6, 1e-5));
    EXPECT_TRUE(testing::all_close(b.grad(), raw::sum(g64, {0}), 1e-6, 1e-5));
  }
}

// compute_weight is what the GEMMs read; the gradient still reaches the master weight.
TEST(LinearOps, ComputeWeightIsReadAndNotDifferentiated) {
  const Tensor x = raw::to(random_tensor({5, 8}, DType::f32, 1), DType::bf16);
  Tensor w = random_tensor({8, 8}, DType::f32, 2).set_requires_grad(true);
  const Tensor wc = raw::to(w, DType::bf16);
  Tensor y_cached = linear(x, w, Tensor(), wc);
  Tensor y_cast = linear(x, w);
  EXPECT_TRUE(testing::all_close(y_cached, y_cast, 0, 0));
  backward(y_cached, raw::to(random_tensor({5, 8}, DType::f32, 3), DType::bf16));
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  // A different compute copy changes the result: it is really what the op multiplies with.
  const Tensor zeros_c = raw::to(zeros({8, 8}), DType::bf16);
  EXPECT_EQ(raw::sum(raw::to(linear(x, w, Tensor(), zeros_c), DType::f32)).item<float>(), 0.0f);
  // compute_bias likewise: the bias the epilogue adds; its gradient goes to the f32 bias.
  Tensor b = random_tensor({8}, DType::f32, 4).set_requires_grad(true);
  const Tensor y = linear(x, LinearWeights{w, b, zeros_c, raw::to(zeros({8}), DType::bf16)});
  EXPECT_EQ(raw::sum(raw::to(y, DType::f32)).item<float>(), 0.0f);
  backward(y, raw::to(random_tensor({5, 8}, DType::f32, 5), DType::bf16));
  ASSERT_TRUE(b.grad().defined());
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  EXPECT_CPF_ERROR(linear(x, LinearWeights{w, b, Tensor(), zeros({8})}),
                   "linear: compute_bias must be the bias [8] in the input dtype bf16, got [8] f32");
  EXPECT_CPF_ERROR(linear(x, LinearWeights{w, Tensor(), Tensor(), raw::to(zeros({8}), DType::bf16)}),
                   "linear: compute_bias must be the bias [] in the input dtype bf16");
}

TEST(LinearOps, RejectsDtypeAndComputeWeightMismatches) {
  const Tensor x64 = zeros({3, 4}, {.dtype = DType::f64});
  const Tensor w32 = zeros({2, 4});
  EXPECT_CPF_ERROR(linear(x64, w32), "linear: input dtype f64 does not match the weight dtype f32 (mixed precision");
  EXPECT_CPF_ERROR(linear_gelu(x64, w32), "linear_gelu: input dtype f64 does not match the weight dtype f32");
  const Tensor xb = zeros({3, 4}, {.dtype = DType::bf16});
  EXPECT_CPF_ERROR(linear(xb, w32, zeros({2}, {.dtype = DType::f64})),
                   "linear: bias dtype f64 must match the weight "
                   "dtype f32");
  EXPECT_CPF_ERROR(linear(xb, w32, Tensor(), zeros({2, 4})),
                   "linear: compute_weight must be the weight [2,4] in the input dtype bf16 on cpu, got [2,4] f32");
  EXPECT_CPF_ERROR(linear(xb, w32, Tensor(), zeros({4, 2}, {.dtype = DType::bf16})),
                   "linear: compute_weight must be the weight [2,4] in the input dtype bf16");
  EXPECT_CPF_ERROR(gelu_mlp(zeros({3, 4}), {zeros({6, 4})}, {zeros({4, 5})}),
                   "linear: x [3,6] must end in "
                   "in_features");
}

// The raw backward halves against their unfused definitions (f64), and their rejected inputs.
TEST(LinearRawOps, DgeluAndParamGradsMatchTheirDefinitions) {
  const Tensor gy = random_tensor({2, 3, 5}, DType::f64, 1);   // (B, T, N)
  const Tensor w = random_tensor({5, 7}, DType::f64, 2);       // (N, K)
  const Tensor pre = random_tensor({2, 3, 7}, DType::f64, 3);  // (B, T, K)
  const raw::LinearDgelu d = raw::linear_dgelu(gy, w, pre, true);
  const Tensor gh = raw::matmul(gy, w);
  const Tensor expect = raw::unary_backward(raw::UnaryOp::gelu, gh, pre, pre);
  EXPECT_TRUE(testing::all_close(d.grad_pre, expect, 1e-12, 1e-12));
  EXPECT_TRUE(testing::all_close(d.bias_grad, raw::sum(expect, {0, 1}), 1e-12, 1e-12));
  EXPECT_FALSE(raw::linear_dgelu(gy, w, pre, false).bias_grad.defined());

  const Tensor x = random_tensor({2, 3, 7}, DType::f64, 4);
  const raw::LinearParamGrads pg = raw::linear_param_grads(gy, x, DType::f64, true);
  const Tensor g2 = raw::reshape(gy, {6, 5}), x2 = raw::reshape(x, {6, 7});
  EXPECT_TRUE(testing::all_close(pg.weight, raw::matmul(raw::transpose(g2, 0, 1), x2), 1e-12, 1e-12));
  EXPECT_TRUE(testing::all_close(pg.bias, raw::sum(g2, {0}), 1e-12, 1e-12));
  // accumulate_into: added in place and returned.
  Tensor acc = raw::clone(pg.weight);
  const raw::LinearParamGrads twice = raw::linear_param_grads(gy, x, DType::f64, false, acc);
  EXPECT_EQ(twice.weight.raw_data(), acc.raw_data());
  EXPECT_TRUE(testing::all_close(acc, raw::mul(pg.weight, 2.0), 1e-12, 1e-12));
  EXPECT_FALSE(twice.bias.defined());
}

TEST(LinearRawOps, RejectsMismatchedInputs) {
  const Tensor gy = zeros({4, 5}), x = zeros({4, 7}), w = zeros({5, 7}), pre = zeros({4, 7});
  EXPECT_CPF_ERROR(raw::linear_param_grads(gy, zeros({3, 7}), DType::f32, false),
                   "linear_param_grads: grad_y [4,5] and x [3,7] must share their leading dims");
  EXPECT_CPF_ERROR(raw::linear_param_grads(gy, x, DType::f64, false),
                   "linear_param_grads: gradient dtype f64 for f32 operands is not supported");
  EXPECT_CPF_ERROR(raw::linear_param_grads(gy, x, DType::f32, false, zeros({7, 5})),
                   "linear_param_grads: accumulate_into must be a contiguous (5, 7) f32 tensor on cpu, got [7,5]");
  EXPECT_CPF_ERROR(raw::linear_dgelu(gy, zeros({7, 5}), pre, false),
                   "linear_dgelu: weight must be (N, K) = (5, 7) for grad_y [4,5] and pre [4,7], got [7,5]");
  EXPECT_CPF_ERROR(raw::linear_dgelu(gy, w, zeros({2, 7}), false),
                   "linear_dgelu: grad_y [4,5] and pre [2,7] must share their leading dims");
  EXPECT_CPF_ERROR(raw::linear_gelu(x, zeros({5, 6}), Tensor()), "linear_gelu: x [4,7] must end in in_features");
  EXPECT_CPF_ERROR(raw::linear_gelu(x, w, zeros({4})), "linear_gelu: bias must have shape [5] (out_features), got [4]");
}

}  // namespace
}  // namespace cpf
