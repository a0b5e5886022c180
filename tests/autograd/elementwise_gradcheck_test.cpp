#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "support/gradcheck_utils.h"

namespace cpf {
namespace {

using testing::grad_input;
using Inputs = std::vector<Tensor>;

TEST(ElementwiseGradcheck, BinaryOpsWithBroadcasting) {
  Tensor a = grad_input({3, 4}, 1);
  Tensor b = grad_input({4}, 2, 0.5, 1.5);
  EXPECT_GRADCHECK([](const Inputs& x) { return add(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return sub(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return maximum(x[0], x[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return minimum(x[0], x[1]); }, Inputs{a, b});
  Tensor base = grad_input({2, 3}, 3, 0.5, 2.0);
  Tensor expo = grad_input({2, 3}, 4);
  EXPECT_GRADCHECK([](const Inputs& x) { return pow(x[0], x[1]); }, Inputs{base, expo});
  EXPECT_GRADCHECK([](const Inputs& x) { return pow(x[0], 2.5); }, Inputs{base});
}

TEST(ElementwiseGradcheck, UnaryOps) {
  Tensor x = grad_input({2, 5}, 5);
  Tensor positive = grad_input({2, 5}, 6, 0.2, 2.0);
  for (auto fn : {&neg, &exp, &tanh, &gelu, &silu, &sigmoid, &square}) {
    EXPECT_GRADCHECK([fn](const Inputs& in) { return fn(in[0]); }, Inputs{x});
  }
  for (auto fn : {&log, &sqrt, &rsqrt, &relu, &abs}) {
    EXPECT_GRADCHECK([fn](const Inputs& in) { return fn(in[0]); }, Inputs{positive});
  }
}

TEST(ElementwiseGradcheck, NonContiguousInputs) {
  Tensor base = grad_input({4, 3}, 7);
  EXPECT_GRADCHECK([](const Inputs& x) { return mul(transpose(x[0], 0, 1), tanh(transpose(x[0], 0, 1))); },
                   Inputs{base});
}

TEST(ElementwiseGradcheck, ReductionsAndMatmul) {
  Tensor x = grad_input({2, 3, 4}, 8);
  EXPECT_GRADCHECK([](const Inputs& in) { return sum(in[0], {1}); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return mean(in[0], {0, 2}, true); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return logsumexp(in[0], {-1}); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return amax(in[0], {1}); }, Inputs{x});
  Tensor a = grad_input({2, 3, 4}, 9);
  Tensor b = grad_input({4, 5}, 10);
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[1]); }, Inputs{a, b});
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(transpose(in[1], 0, 1), transpose(in[0], 1, 2)); },
                   Inputs{a, b});
  Tensor v = grad_input({4}, 11);
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[1]); }, Inputs{a, v});
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[1]); }, Inputs{v, b});
  EXPECT_GRADCHECK([](const Inputs& in) { return matmul(in[0], in[0]); }, Inputs{v});
}

}  // namespace
}  // namespace cpf
