// cpf::classifier_loss through autograd on every device of support/test_device.h: the f64 gradcheck of
// both inputs (several chunkings, ignored labels, a normalizer), equality with the unfused graph
// (linear, cross_entropy, rescale) in loss and every gradient, the loss-gradient scaling, and the
// no-grad path.
#include <gtest/gtest.h>

#include "framework/autograd/functions/classifier_loss.h"
#include "framework/autograd/ops.h"
#include "support/gradcheck_utils.h"
#include "support/test_device.h"

namespace cpf {
namespace {

using Inputs = std::vector<Tensor>;
using testing::all_close;

class ClassifierLossAutograd : public testing::DeviceTest {
 protected:
  Tensor labels(std::vector<int64_t> values) const {
    const auto n = static_cast<int64_t>(values.size());
    return on_device(from_vector(values, {n}));
  }
};

// The unfused graph: the whole logits, mean cross-entropy rescaled to sum / divisor (GPT::loss).
Tensor unfused_loss(const Tensor& hidden, const Tensor& weight, const Tensor& labels, int64_t valid, int64_t divisor) {
  const Tensor logits = matmul(hidden, transpose(weight, 0, 1));  // (T, V)
  return mul(cross_entropy(logits, labels, -100), static_cast<double>(valid) / static_cast<double>(divisor));
}

TEST_P(ClassifierLossAutograd, Gradcheck) {
  const Tensor hidden = grad_leaf({7, 4}, 1, -2, 2);
  const Tensor weight = grad_leaf({6, 4}, 2, -2, 2);
  const Tensor l = labels({0, 5, -100, 3, 3, 1, 2});
  for (int64_t chunk : {0, 1, 3}) {
    for (int64_t normalizer : {int64_t(0), int64_t(9)}) {
      const ClassifierLossOptions o{.normalizer = normalizer, .chunk_rows = chunk};
      EXPECT_GRADCHECK([&](const Inputs& in) { return classifier_loss(in[0], in[1], l, o); }, Inputs{hidden, weight});
    }
  }
  // Only one input requiring grad; and the op composed with a norm before it, as at the end of a model.
  const Tensor fixed = grad_leaf({6, 4}, 3).detach();
  EXPECT_GRADCHECK([&](const Inputs& in) { return classifier_loss(in[0], fixed, l, {.chunk_rows = 2}); },
                   Inputs{hidden});
  const Tensor gain = grad_leaf({4}, 4, 0.5, 1.5);
  EXPECT_GRADCHECK([&](const Inputs& in) { return classifier_loss(rms_norm(in[0], in[2]), in[1], l, {.chunk_rows = 4}); },
                   Inputs{hidden, weight, gain});
}

TEST_P(ClassifierLossAutograd, EqualsTheUnfusedGraph) {
  const std::vector<int64_t> values{4, -100, 0, 10, 7, 7, 2, -100, 1, 9, 3};
  const int64_t valid = 9;
  for (int64_t normalizer : {int64_t(0), int64_t(20)}) {
    const int64_t divisor = normalizer > 0 ? normalizer : valid;
    Tensor h1 = grad_leaf({11, 5}, 5, -2, 2), w1 = grad_leaf({12, 5}, 6, -2, 2);
    Tensor h2 = grad_leaf({11, 5}, 5, -2, 2), w2 = grad_leaf({12, 5}, 6, -2, 2);
    const Tensor fused = classifier_loss(h1, w1, labels(values), {.normalizer = normalizer, .chunk_rows = 4});
    const Tensor plain = unfused_loss(h2, w2, labels(values), valid, divisor);
    EXPECT_TRUE(all_close(raw::to(fused, Device::cpu()), raw::to(plain, Device::cpu()), 1e-12, 1e-12));
    // A loss gradient other than 1 reaches both gradients (the saved ones are scaled).
    backward(mul(fused, 2.5));
    backward(mul(plain, 2.5));
    EXPECT_TRUE(all_close(raw::to(h1.grad(), Device::cpu()), raw::to(h2.grad(), Device::cpu()), 1e-12, 1e-12));
    EXPECT_TRUE(all_close(raw::to(w1.grad(), Device::cpu()), raw::to(w2.grad(), Device::cpu()), 1e-12, 1e-12));
  }
}

TEST_P(ClassifierLossAutograd, NoGradComputesTheLossAlone) {
  const Tensor hidden = grad_leaf({5, 3}, 7);
  const Tensor weight = grad_leaf({4, 3}, 8);
  const Tensor l = labels({0, 1, 2, 3, -100});
  Tensor loss;
  {
    NoGradGuard no_grad;
    loss = classifier_loss(hidden, weight, l, {.chunk_rows = 2});
  }
  EXPECT_FALSE(loss.requires_grad());
  const Tensor ref = classifier_loss(hidden, weight, l);
  EXPECT_TRUE(ref.requires_grad());
  EXPECT_TRUE(all_close(raw::to(loss, Device::cpu()), raw::to(ref.detach(), Device::cpu()), 1e-12, 1e-12));
}

CPF_INSTANTIATE_DEVICE_SUITE(ClassifierLossAutograd);

}  // namespace
}  // namespace cpf
