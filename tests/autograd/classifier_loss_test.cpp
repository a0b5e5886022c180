// cpf::classifier_loss through autograd on every device of support/test_device.h: the f64 gradcheck of
// both inputs (several chunkings, ignored labels, a normalizer), equality with the unfused graph
// (linear, cross_entropy, rescale) in loss and every gradient, the loss-gradient scaling, and the
// no-grad path; the head as LinearWeights (an f32 master beside bf16 hidden, a given compute copy) and
// the heads it refuses.
#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/functions/classifier_loss.h"
#include "framework/autograd/ops.h"
#include "support/gradcheck_utils.h"
#include "support/test_device.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using Inputs = std::vector<Tensor>;
using testing::all_close;
using testing::random_on;

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
  EXPECT_GRADCHECK(
      [&](const Inputs& in) { return classifier_loss(rms_norm(in[0], in[2]), in[1], l, {.chunk_rows = 4}); },
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

// The head as LinearWeights: an f32 master beside bf16 hidden gets its gradient in f32, the chunks' f32
// sum itself (the raw op's dweight at a loss gradient of 1), not rounded through bf16; dhidden is bf16.
TEST_P(ClassifierLossAutograd, AnF32MasterGetsTheF32SumDirectly) {
  const Tensor h64 = random_on(device(), {9, 8}, DType::f64, 11, -2, 2);
  const Tensor hidden = raw::to(h64, DType::bf16).detach().set_requires_grad(true);
  Tensor master = random_on(device(), {10, 8}, DType::f32, 12, -1, 1);
  master.set_requires_grad(true);
  const Tensor l = labels({0, 9, -100, 4, 4, 1, 2, 3, 5});
  const Tensor loss =
      classifier_loss(hidden, LinearWeights{master, Tensor(), Tensor(), Tensor()}, l, {.chunk_rows = 4});
  backward(loss);
  const raw::ClassifierLossResult ref =
      raw::classifier_loss(hidden.detach(), raw::to(master.detach(), DType::bf16), l, {.chunk_rows = 4});
  ASSERT_EQ(master.grad().dtype(), DType::f32);
  EXPECT_TRUE(all_close(raw::to(master.grad(), Device::cpu()), raw::to(ref.dweight, Device::cpu()), 0, 0));
  EXPECT_EQ(hidden.grad().dtype(), DType::bf16);
  EXPECT_TRUE(all_close(raw::to(hidden.grad(), Device::cpu()),
                        raw::to(raw::to(ref.dhidden, DType::bf16), Device::cpu()), 0, 0));
  EXPECT_TRUE(all_close(raw::to(loss.detach(), Device::cpu()), raw::to(ref.loss, Device::cpu()), 0, 0));
}

TEST_P(ClassifierLossAutograd, AGivenComputeWeightIsWhatTheGemmsRead) {
  // A zero compute copy: every logit 0, so each valid row's loss is log(V) and the master's values unused.
  const Tensor hidden = raw::to(random_on(device(), {4, 8}, DType::f64, 13), DType::bf16);
  Tensor master = random_on(device(), {6, 8}, DType::f32, 14);
  master.set_requires_grad(true);
  const Tensor zero_copy = raw::to(zeros({6, 8}), device());
  const Tensor copy = raw::to(zero_copy, DType::bf16);
  const Tensor loss = classifier_loss(hidden, LinearWeights{master, Tensor(), copy, Tensor()}, labels({0, 1, 2, 3}));
  EXPECT_NEAR(raw::to(loss.detach(), Device::cpu()).item<double>(), std::log(6.0), 1e-6);
}

TEST_P(ClassifierLossAutograd, RejectsAHeadItCannotUse) {
  const Tensor hidden = raw::to(random_on(device(), {4, 8}, DType::f64, 15), DType::bf16);
  const Tensor master = random_on(device(), {6, 8}, DType::f32, 16);
  const Tensor l = labels({0, 1, 2, 3});
  EXPECT_CPF_ERROR(classifier_loss(hidden, LinearWeights{master, raw::to(zeros({6}), device()), Tensor(), Tensor()}, l),
                   "classifier_loss: the head takes no bias (got one of shape [6])");
  EXPECT_CPF_ERROR(classifier_loss(hidden, LinearWeights{raw::to(master, DType::f64), Tensor(), Tensor(), Tensor()}, l),
                   "classifier_loss: hidden dtype bf16 does not match the head weight dtype f64");
  EXPECT_CPF_ERROR(classifier_loss(hidden, LinearWeights{master, Tensor(), master, Tensor()}, l),
                   "classifier_loss: compute_weight must be the head weight [6,8] in hidden's dtype bf16");
  EXPECT_CPF_ERROR(classifier_loss(hidden, master, l),
                   "classifier_loss: hidden dtype bf16 differs from weight dtype f32 (pass the head as LinearWeights");
}

CPF_INSTANTIATE_DEVICE_SUITE(ClassifierLossAutograd);

}  // namespace
}  // namespace cpf
