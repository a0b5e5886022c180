// f64 gradcheck of the residual add fused with LayerNorm / RMSNorm (framework/autograd/functions/
// add_norm.h) on every device of support/test_device.h: both outputs (x1 and y) are contracted, so the
// gradient of x and of the branch carries grad_x1 plus the norm's input gradient. With and without a
// branch, weight and bias, on strided inputs; the autograd graph's shape (x1 is x without a branch).
#include <gtest/gtest.h>

#include "framework/autograd/functions/add_norm.h"
#include "framework/autograd/ops.h"
#include "support/gradcheck_utils.h"
#include "support/test_device.h"

namespace cpf {
namespace {

using Inputs = std::vector<Tensor>;
using Outputs = std::vector<Tensor>;

class AddNormGradcheck : public testing::DeviceTest {};

Outputs both(const AddNormOutput& o) { return {o.x1, o.y}; }

TEST_P(AddNormGradcheck, LayerNorm) {
  Tensor x = grad_leaf({4, 6}, 1, -2, 2);
  Tensor b = grad_leaf({4, 6}, 2, -1, 1);
  Tensor w = grad_leaf({6}, 3, 0.5, 1.5);
  Tensor bias = grad_leaf({6}, 4);
  const auto f64 = DType::f64;
  EXPECT_GRADCHECK([f64](const Inputs& in) { return both(add_layer_norm(in[0], in[1], in[2], in[3], 1e-5, f64)); },
                   Inputs{x, b, w, bias});
  EXPECT_GRADCHECK([f64](const Inputs& in) { return both(add_layer_norm(in[0], in[1], in[2], Tensor(), 1e-5, f64)); },
                   Inputs{x, b, w});
  EXPECT_GRADCHECK(
      [f64](const Inputs& in) { return both(add_layer_norm(in[0], in[1], Tensor(), Tensor(), 1e-5, f64)); },
      Inputs{x, b});
  // No branch: the plain norm (x1 is x, so only y is an output of the op).
  EXPECT_GRADCHECK(
      [f64](const Inputs& in) { return Outputs{add_layer_norm(in[0], Tensor(), in[1], in[2], 1e-5, f64).y}; },
      Inputs{x, w, bias});
  // Strided inputs and a 3-D stream.
  Tensor xs = strided_leaf(5, 3, 5);
  Tensor bs = strided_leaf(5, 3, 6);
  Tensor w3 = grad_leaf({3}, 7, 0.5, 1.5);
  EXPECT_GRADCHECK([f64](const Inputs& in) { return both(add_layer_norm(in[0], in[1], in[2], in[2], 1e-5, f64)); },
                   Inputs{xs, bs, w3});
  Tensor x3 = grad_leaf({2, 3, 5}, 8, -2, 2);
  Tensor b3 = grad_leaf({2, 3, 5}, 9);
  EXPECT_GRADCHECK(
      [f64](const Inputs& in) { return both(add_layer_norm(in[0], in[1], Tensor(), Tensor(), 1e-5, f64)); },
      Inputs{x3, b3});
}

TEST_P(AddNormGradcheck, RmsNorm) {
  Tensor x = grad_leaf({4, 6}, 11, -2, 2);
  Tensor b = grad_leaf({4, 6}, 12, -1, 1);
  Tensor w = grad_leaf({6}, 13, 0.5, 1.5);
  const auto f64 = DType::f64;
  EXPECT_GRADCHECK([f64](const Inputs& in) { return both(add_rms_norm(in[0], in[1], in[2], 1e-6, f64)); },
                   Inputs{x, b, w});
  EXPECT_GRADCHECK([f64](const Inputs& in) { return both(add_rms_norm(in[0], in[1], Tensor(), 1e-6, f64)); },
                   Inputs{x, b});
  EXPECT_GRADCHECK([f64](const Inputs& in) { return Outputs{add_rms_norm(in[0], Tensor(), in[1], 1e-6, f64).y}; },
                   Inputs{x, w});
  Tensor xs = strided_leaf(5, 4, 14);
  Tensor bs = strided_leaf(5, 4, 15);
  EXPECT_GRADCHECK([f64](const Inputs& in) { return both(add_rms_norm(in[0], in[1], Tensor(), 1e-6, f64)); },
                   Inputs{xs, bs});
}

// Only one output used: the other's gradient is absent (zero), on either side.
TEST_P(AddNormGradcheck, OneOutputUsed) {
  Tensor x = grad_leaf({3, 5}, 21, -2, 2);
  Tensor b = grad_leaf({3, 5}, 22);
  Tensor w = grad_leaf({5}, 23, 0.5, 1.5);
  const auto f64 = DType::f64;
  EXPECT_GRADCHECK([f64](const Inputs& in) { return Outputs{add_layer_norm(in[0], in[1], in[2], in[2], 1e-5, f64).y}; },
                   Inputs{x, b, w});
  EXPECT_GRADCHECK([f64](const Inputs& in) { return Outputs{add_rms_norm(in[0], in[1], in[2], 1e-6, f64).x1}; },
                   Inputs{x, b, w});
}

TEST_P(AddNormGradcheck, WithoutBranchX1IsXItself) {
  Tensor x = grad_leaf({2, 4}, 31);
  Tensor w = grad_leaf({4}, 32, 0.5, 1.5);
  const AddNormOutput o = add_rms_norm(x, Tensor(), w, 1e-6, DType::f64);
  EXPECT_TRUE(o.x1.is_same(x));
  EXPECT_TRUE(o.y.requires_grad());
  const AddNormOutput a = add_layer_norm(x, grad_leaf({2, 4}, 33), w, Tensor(), 1e-5, DType::f64);
  EXPECT_FALSE(a.x1.is_same(x));
  EXPECT_TRUE(a.x1.requires_grad());
}

CPF_INSTANTIATE_DEVICE_SUITE(AddNormGradcheck);

}  // namespace
}  // namespace cpf
