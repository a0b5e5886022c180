// f64 gradcheck of the nn ops (softmax, norms, embedding, cross-entropy, RoPE) on every device of
// support/test_device.h, and the dtype/integer-input rules of their gradients.
#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "support/gradcheck_utils.h"
#include "support/test_device.h"

namespace cpf {
namespace {

using Inputs = std::vector<Tensor>;

class NnGradcheck : public testing::DeviceTest {};
class NnAutograd : public testing::DeviceTest {};

TEST_P(NnGradcheck, Softmax) {
  Tensor x = grad_leaf({3, 5}, 1, -2, 2);
  Tensor x3 = grad_leaf({2, 4, 3}, 2, -2, 2);
  for (int64_t dim : {-1, 0}) {
    EXPECT_GRADCHECK([dim](const Inputs& in) { return softmax(in[0], dim); }, Inputs{x});
    EXPECT_GRADCHECK([dim](const Inputs& in) { return log_softmax(in[0], dim); }, Inputs{x});
  }
  // A middle dim (the column-group path) and a non-contiguous input.
  EXPECT_GRADCHECK([](const Inputs& in) { return softmax(in[0], 1); }, Inputs{x3});
  EXPECT_GRADCHECK([](const Inputs& in) { return log_softmax(in[0], 1); }, Inputs{x3});
  EXPECT_GRADCHECK([](const Inputs& in) { return softmax(transpose(in[0], 0, 2), -1); }, Inputs{x3});
}

TEST_P(NnGradcheck, LayerNorm) {
  Tensor x = grad_leaf({4, 6}, 3, -2, 2);
  Tensor w = grad_leaf({6}, 4, 0.5, 1.5);
  Tensor b = grad_leaf({6}, 5);
  EXPECT_GRADCHECK([](const Inputs& in) { return layer_norm(in[0], in[1], in[2], 1e-5); }, Inputs{x, w, b});
  EXPECT_GRADCHECK([](const Inputs& in) { return layer_norm(in[0], in[1], Tensor(), 1e-5); }, Inputs{x, w});
  EXPECT_GRADCHECK([](const Inputs& in) { return layer_norm(in[0], Tensor(), in[1], 1e-5); }, Inputs{x, b});
  EXPECT_GRADCHECK([](const Inputs& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-5); }, Inputs{x});
  Tensor x3 = grad_leaf({2, 3, 5}, 6, -2, 2);
  Tensor w5 = grad_leaf({5}, 7, 0.5, 1.5);
  EXPECT_GRADCHECK([](const Inputs& in) { return layer_norm(transpose(in[0], 0, 1), in[1], in[1], 1e-5); },
                   Inputs{x3, w5});
}

TEST_P(NnGradcheck, RmsNorm) {
  Tensor x = grad_leaf({4, 6}, 8, -2, 2);
  Tensor w = grad_leaf({6}, 9, 0.5, 1.5);
  EXPECT_GRADCHECK([](const Inputs& in) { return rms_norm(in[0], in[1], 1e-6); }, Inputs{x, w});
  EXPECT_GRADCHECK([](const Inputs& in) { return rms_norm(in[0], Tensor(), 1e-6); }, Inputs{x});
  Tensor x3 = grad_leaf({2, 3, 5}, 10, -2, 2);
  EXPECT_GRADCHECK([](const Inputs& in) { return rms_norm(in[0], in[1], 1e-6); }, Inputs{x3, grad_leaf({5}, 11)});
}

TEST_P(NnGradcheck, Embedding) {
  Tensor weight = grad_leaf({7, 4}, 12);
  const Tensor ids = on_device(from_vector<int64_t>({1, 5, 1, 0, 6, 1}, {2, 3}));
  EXPECT_GRADCHECK([ids](const Inputs& in) { return embedding(in[0], ids); }, Inputs{weight});
  const Tensor ids32 = on_device(from_vector<int32_t>({3, 3, 3}, {3}));
  EXPECT_GRADCHECK([ids32](const Inputs& in) { return embedding(in[0], ids32); }, Inputs{weight});
}

TEST_P(NnGradcheck, CrossEntropy) {
  Tensor logits = grad_leaf({5, 4}, 13, -3, 3);
  const Tensor targets = on_device(from_vector<int64_t>({0, 3, -100, 1, 1}, {5}));
  EXPECT_GRADCHECK([targets](const Inputs& in) { return cross_entropy(in[0], targets); }, Inputs{logits});
  const Tensor targets32 = on_device(from_vector<int32_t>({2, 2, 0, 3, 2}, {5}));
  EXPECT_GRADCHECK([targets32](const Inputs& in) { return cross_entropy(in[0], targets32, 2); }, Inputs{logits});
  // Composed with a normalisation, as at the end of a model.
  Tensor w = grad_leaf({4}, 14, 0.5, 1.5);
  EXPECT_GRADCHECK([targets](const Inputs& in) { return cross_entropy(rms_norm(in[0], in[1]), targets); },
                   Inputs{logits, w});
}

TEST_P(NnGradcheck, Rope) {
  Tensor x = grad_leaf({2, 3, 2, 6}, 15);
  const Tensor pos = on_device(from_vector<int64_t>({0, 4, 9}, {3}));
  const Tensor pos_bt = on_device(from_vector<int32_t>({1, 2, 3, 7, 8, 9}, {2, 3}));
  EXPECT_GRADCHECK([pos](const Inputs& in) { return rope(in[0], pos); }, Inputs{x});
  EXPECT_GRADCHECK([pos_bt](const Inputs& in) { return rope(in[0], pos_bt, 100.0, 4); }, Inputs{x});
  EXPECT_GRADCHECK([pos](const Inputs& in) { return rope(in[0], pos, 10000.0, 2, true); }, Inputs{x});
  const RopeFrequencies llama3{.base = 500.0, .scaling = {.factor = 4, .high_freq_factor = 8, .original_context = 16}};
  EXPECT_GRADCHECK([pos, llama3](const Inputs& in) { return rope(in[0], pos, llama3); }, Inputs{x});
  Tensor thd = grad_leaf({3, 2, 4}, 16);
  EXPECT_GRADCHECK([pos](const Inputs& in) { return rope(in[0], pos); }, Inputs{thd});
}

TEST_P(NnAutograd, Bf16GradientsKeepTheInputDtype) {
  Tensor logits = testing::random_on(device(), {4, 6}, DType::bf16, 17);
  logits.set_requires_grad(true);
  Tensor w = testing::random_on(device(), {6}, DType::bf16, 18);
  w.set_requires_grad(true);
  const Tensor loss =
      cross_entropy(log_softmax(layer_norm(logits, w, w), -1), on_device(from_vector<int64_t>({0, 1, 2, 5}, {4})));
  EXPECT_EQ(loss.dtype(), DType::f32);
  backward(loss);
  ASSERT_TRUE(logits.grad().defined());
  EXPECT_EQ(logits.grad().dtype(), DType::bf16);
  EXPECT_EQ(logits.grad().device(), device());
  EXPECT_EQ(w.grad().dtype(), DType::bf16);
}

TEST_P(NnAutograd, IntegerInputsAreNotDifferentiated) {
  Tensor weight = grad_leaf({5, 3}, 19);
  const Tensor ids = on_device(from_vector<int64_t>({4, 4}, {2}));
  backward(sum(embedding(weight, ids)));
  const auto g = weight.grad().to_vector<double>();
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(g[r * 3 + c], r == 4 ? 2.0 : 0.0);
  }
  EXPECT_FALSE(ids.requires_grad());
}

CPF_INSTANTIATE_DEVICE_SUITE(NnGradcheck);
CPF_INSTANTIATE_DEVICE_SUITE(NnAutograd);

}  // namespace
}  // namespace cpf
