// f64 gradcheck of the element-wise ops, reductions and matmul on every device of
// support/test_device.h (the CPU, and cuda:0 in CUDA builds: finite differences run the device kernels).
#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "support/gradcheck_utils.h"
#include "support/test_device.h"

namespace cpf {
namespace {

using Inputs = std::vector<Tensor>;

class ElementwiseGradcheck : public testing::DeviceTest {};

TEST_P(ElementwiseGradcheck, BinaryOpsWithBroadcasting) {
  Tensor a = grad_leaf({3, 4}, 1);
  Tensor b = grad_leaf({4}, 2, 0.5, 1.5);
  EXPECT_GRADCHECK([](const Inputs& x) { return add(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return sub(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return maximum(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return minimum(x[0], x[1]); }, Inputs{a, b});
  Tensor base = grad_leaf({2, 3}, 3, 0.5, 2.0);
  Tensor expo = grad_leaf({2, 3}, 4);
  EXPECT_GRADCHECK([](const Inputs& x) { return pow(x[0], x[1]); }, Inputs{base, expo});
  EXPECT_GRADCHECK([](const Inputs& x) { return pow(x[0], 2.5); }, Inputs{base});
  // Both operands broadcast: (2, 1, 3) with (4, 1) -> (2, 4, 3).
  Tensor p = grad_leaf({2, 1, 3}, 5), q = grad_leaf({4, 1}, 6, 0.5, 1.5);
  EXPECT_GRADCHECK([](const Inputs& x) { return div(mul(x[0], x[1]), x[1] + 1.0); }, Inputs{p, q});
}

TEST_P(ElementwiseGradcheck, UnaryOps) {
  Tensor x = grad_leaf({2, 5}, 5);
  Tensor positive = grad_leaf({2, 5}, 6, 0.2, 2.0);
  for (auto fn : {&neg, &exp, &tanh, &gelu, &silu, &sigmoid, &square}) {
    EXPECT_GRADCHECK([fn](const Inputs& in) { return fn(in[0]); }, Inputs{x});
  }
  for (auto fn : {&log, &sqrt, &rsqrt, &relu, &abs}) {
    EXPECT_GRADCHECK([fn](const Inputs& in) { return fn(in[0]); }, Inputs{positive});
  }
}

TEST_P(ElementwiseGradcheck, NonContiguousInputs) {
  Tensor base = grad_leaf({4, 3}, 7);
  EXPECT_GRADCHECK([](const Inputs& x) { return mul(transpose(x[0], 0, 1), tanh(transpose(x[0], 0, 1))); },
                   Inputs{base});
  // A strided leaf (the transpose of a contiguous tensor) read directly by the kernels.
  Tensor t = strided_leaf(3, 4, 8);
  Tensor u = grad_leaf({3, 4}, 9);
  EXPECT_GRADCHECK([](const Inputs& x) { return add(mul(x[0], x[1]), exp(x[0])); }, Inputs{t, u});
}

TEST_P(ElementwiseGradcheck, ReductionsAndMatmul) {
  Tensor x = grad_leaf({2, 3, 4}, 8);
  EXPECT_GRADCHECK([](const Inputs& in) { return sum(in[0], {1}); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return mean(in[0], {0, 2}, true); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return logsumexp(in[0], {-1}); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return amax(in[0], {1}); }, Inputs{x});
  Tensor a = grad_leaf({2, 3, 4}, 9);
  Tensor b = grad_leaf({4, 5}, 10);
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(transpose(in[1], 0, 1), transpose(in[0], 1, 2)); },
                   Inputs{a, b});
  Tensor rows4 = grad_leaf({1, 3, 2, 4}, 12);  // batched rows against a shared matrix: the folded dB GEMM
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[1]); }, Inputs{rows4, b});
  Tensor v = grad_leaf({4}, 11);
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[1]); }, Inputs{a, v});
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[1]); }, Inputs{v, b});
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[0]); }, Inputs{v});
}

CPF_INSTANTIATE_DEVICE_SUITE(ElementwiseGradcheck);

}  // namespace
}  // namespace cpf
