// f64 gradcheck of every differentiable view and conversion in framework/autograd/functions/shape.h,
// on contiguous and non-contiguous inputs, on every device of support/test_device.h. Each view is followed by a
// non-linear op so that a wrong index mapping in the backward cannot cancel out.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "framework/autograd/functions/shape.h"
#include "framework/autograd/node.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"
#include "support/gradcheck_utils.h"
#include "support/host_as_device.h"
#include "support/test_device.h"

namespace cpf {
namespace {

using Inputs = std::vector<Tensor>;

class ShapeGradcheck : public testing::DeviceTest {
 protected:
  // A transposed leaf: the same values as a (4, 3) input, seen through non-unit strides.
  Tensor transposed_input(uint64_t seed) const { return strided_leaf(4, 3, seed); }
};

TEST_P(ShapeGradcheck, ViewReshapeFlatten) {
  Tensor x = grad_leaf({2, 3, 4}, 1);
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(view(in[0], {6, 4})); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(view(in[0], {-1})); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(reshape(in[0], {4, -1, 2})); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(flatten(in[0], 1)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(flatten(in[0], 0, 1)); }, Inputs{x});
  Tensor t = transposed_input(2);
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(reshape(in[0], {2, 6})); }, Inputs{t});  // copies
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(flatten(in[0])); }, Inputs{t});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(view(in[0], {2, 2, 3})); }, Inputs{t});
}

TEST_P(ShapeGradcheck, PermuteTranspose) {
  Tensor x = grad_leaf({2, 3, 4}, 3);
  Tensor w = constant({4, 2, 3}, 4);
  EXPECT_GRADCHECK([w](const Inputs& in) { return mul(tanh(permute(in[0], {2, 0, 1})), w); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(permute(in[0], {-1, 1, 0})); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(transpose(in[0], 0, -1)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(transpose(in[0], 1, 2)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(transpose(in[0], 0, 1)); }, Inputs{transposed_input(5)});
}

TEST_P(ShapeGradcheck, NarrowSliceSelect) {
  Tensor x = grad_leaf({4, 6}, 6);
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(narrow(in[0], 1, 2, 3)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(narrow(in[0], -2, 1, 2)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(slice(in[0], 1, 1, 6, 2)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(slice(in[0], 0, -3, 100, 2)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(slice(in[0], 1, -4, -1)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(select(in[0], 0, 2)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(select(in[0], 1, -1)); }, Inputs{x});
  Tensor t = transposed_input(7);  // (4, 3)
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(select(narrow(in[0], 0, 1, 2), 1, 2)); }, Inputs{t});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(slice(in[0], 0, 0, 4, 3)); }, Inputs{t});
  // Overlapping views of one input accumulate.
  EXPECT_GRADCHECK([](const Inputs& in) { return mul(narrow(in[0], 1, 0, 4), tanh(narrow(in[0], 1, 2, 4))); },
                   Inputs{x});
}

TEST_P(ShapeGradcheck, ExpandSqueezeUnsqueeze) {
  Tensor x = grad_leaf({3, 1}, 8);
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(mul(expand(in[0], {2, 3, 4}), 1.5)); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(expand(in[0], {-1, 5})); }, Inputs{x});
  Tensor s = grad_leaf({}, 9);
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(expand(in[0], {2, 2})); }, Inputs{s});
  Tensor y = grad_leaf({3, 1, 2}, 10);
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(squeeze(in[0], 1)); }, Inputs{y});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(squeeze(in[0], -2)); }, Inputs{y});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(unsqueeze(in[0], 0)); }, Inputs{y});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(unsqueeze(in[0], -1)); }, Inputs{y});
  EXPECT_GRADCHECK(
      [](const Inputs& in) {
        return tanh(expand(unsqueeze(in[0], 1), {4, 2, 3}));
      },
      Inputs{transposed_input(11)});
}

TEST_P(ShapeGradcheck, ContiguousAndClone) {
  Tensor t = transposed_input(12);
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(contiguous(in[0])); }, Inputs{t});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(clone(in[0])); }, Inputs{t});
  Tensor x = grad_leaf({2, 3}, 13);
  EXPECT_GRADCHECK([](const Inputs& in) { return mul(clone(in[0]), in[0]); }, Inputs{x});
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(contiguous(in[0])); }, Inputs{x});  // a no-op
}

TEST_P(ShapeGradcheck, DTypeConversions) {
  Tensor x = grad_leaf({2, 3}, 14);
  EXPECT_GRADCHECK([](const Inputs& in) { return tanh(to(in[0], DType::f64)); }, Inputs{x});  // no-op
  // Through f32 and bf16 the forward rounds, so the finite differences need a step the reduced dtype
  // resolves: inputs on a 1/8 grid with eps = 1/8 stay exact in both for this linear function. The
  // gradient flowing back is rounded to the reduced dtype once (one bf16 rounding: 2^-9 relative).
  Generator gen(15);
  Tensor grid = on_device(raw::mul(raw::to(randint(-16, 16, {2, 3}, {.dtype = DType::i64}, &gen), DType::f64), 0.125));
  grid.set_requires_grad(true);
  Tensor w = constant({2, 3}, 15);
  for (DType reduced : {DType::f32, DType::bf16}) {
    GradcheckOptions options;
    options.eps = 0.125;
    if (reduced == DType::bf16) options.atol = options.rtol = 1e-2;
    const GradcheckReport r =
        gradcheck([w, reduced](const Inputs& in) { return mul(to(mul(to(in[0], reduced), 2.0), DType::f64), w); },
                  Inputs{grid}, options);
    EXPECT_TRUE(r.ok) << dtype_name(reduced) << ": " << r.str();
    EXPECT_EQ(r.checked, 6);
    // A wrong factor in the same setting is still caught.
    const GradcheckReport wrong = gradcheck(
        [w, reduced](const Inputs& in) {
          Tensor y = to(mul(to(in[0], reduced), 2.0), DType::f64);
          return mul(
              autograd::record("x1.05", raw::mul(y, 1.0), {y},
                               [](const autograd::GradList& g) { return autograd::GradList{raw::mul(g[0], 1.05)}; }),
              w);
        },
        Inputs{grid}, options);
    EXPECT_FALSE(wrong.ok) << dtype_name(reduced);
  }
}

TEST_P(ShapeGradcheck, DeviceTransfers) {
  Tensor x = grad_leaf({2, 3}, 16);
  EXPECT_TRUE(to(x, device()).is_same(x));
  // Through the host and back: on a device both directions are real transfers.
  EXPECT_GRADCHECK(
      [this](const Inputs& in) {
        Tensor host = to(in[0], Device::cpu());
        EXPECT_EQ(host.device(), Device::cpu());
        return tanh(to(mul(host, 2.0), device()));
      },
      Inputs{x});
  EXPECT_EQ(x.grad().device(), device());
}

using HostAsDevice = testing::HostAsDevice;  // tests/support/host_as_device.h

TEST(ShapeGradcheckFakeDevice, DeviceTransfers) {
  if (has_device_backend(DeviceType::cuda)) GTEST_SKIP() << "a real CUDA backend is registered";
  Tensor x = testing::grad_input({2, 3}, 16);
  HostAsDevice backend;
  register_device_backend(DeviceType::cuda, &backend);
  EXPECT_GRADCHECK(
      [](const Inputs& in) {
        Tensor remote = to(in[0], Device::cuda());
        EXPECT_EQ(remote.device(), Device::cuda());
        return tanh(to(remote, Device::cpu()));
      },
      Inputs{x});
  EXPECT_EQ(x.grad().device(), Device::cpu());
  register_device_backend(DeviceType::cuda, nullptr);
}

CPF_INSTANTIATE_DEVICE_SUITE(ShapeGradcheck);

}  // namespace
}  // namespace cpf
