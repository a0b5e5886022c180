#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "framework/nn/linear.h"
#include "support/gradcheck_utils.h"

namespace cpf {
namespace {

class TwoLayer : public nn::Module {
 public:
  TwoLayer() {
    first = register_module("first", std::make_shared<nn::Linear>(nn::LinearOptions{3, 4}));
    second = register_module("second", std::make_shared<nn::Linear>(nn::LinearOptions{4, 2, false}));
    scale = register_buffer("scale", ones({2}));
  }
  std::shared_ptr<nn::Linear> first, second;
  Tensor scale;
};

TEST(Module, NamedParameterWalkIsDepthFirstInRegistrationOrder) {
  TwoLayer model;
  std::vector<std::string> names;
  for (auto& [name, t] : model.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"first.weight", "first.bias", "second.weight"}));
  EXPECT_EQ(model.num_parameters(), 3 * 4 + 4 + 4 * 2);
  ASSERT_EQ(model.named_buffers().size(), 1u);
  EXPECT_EQ(model.named_buffers()[0].first, "scale");
  for (const Tensor& p : model.parameters()) EXPECT_TRUE(p.requires_grad());
}

TEST(Module, TrainEvalPropagatesAndZeroGradClears) {
  TwoLayer model;
  model.eval();
  EXPECT_FALSE(model.first->is_training());
  model.train();
  EXPECT_TRUE(model.second->is_training());
  Tensor x = randn({5, 3});
  backward(sum(model.second->forward(model.first->forward(x))));
  EXPECT_TRUE(model.first->weight().grad().defined());
  model.zero_grad();
  EXPECT_FALSE(model.first->weight().grad().defined());
}

TEST(Module, RejectsDuplicateAndInvalidNames) {
  class Bad : public nn::Module {
   public:
    void add(const std::string& name) { register_parameter(name, zeros({1})); }
  };
  Bad bad;
  bad.add("w");
  EXPECT_CPF_ERROR(bad.add("w"), "name 'w' is already registered");
  EXPECT_CPF_ERROR(bad.add("a.b"), "invalid name 'a.b'");
}

TEST(Linear, MatchesManualComputationAndGradchecks) {
  Generator gen(3);
  nn::Linear layer({.in_features = 3, .out_features = 2, .dtype = DType::f64}, &gen);
  Tensor x = testing::grad_input({4, 3}, 9);
  Tensor y = layer.forward(x);
  const auto w = layer.weight().to_vector<double>();
  const auto xv = x.to_vector<double>();
  const auto yv = y.to_vector<double>();
  for (int i = 0; i < 4; ++i) {
    for (int o = 0; o < 2; ++o) {
      double expected = 0;
      for (int k = 0; k < 3; ++k) expected += xv[i * 3 + k] * w[o * 3 + k];
      EXPECT_NEAR(yv[i * 2 + o], expected, 1e-12);
    }
  }
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return layer.forward(in[0]); },
                   (std::vector<Tensor>{x, layer.weight(), layer.bias()}));
}

TEST(Linear, ValidatesOptionsAndInput) {
  EXPECT_CPF_ERROR(nn::Linear(nn::LinearOptions{0, 3}), "in_features=0 and out_features=3 must be positive");
  nn::Linear layer({.in_features = 3, .out_features = 2});
  EXPECT_CPF_ERROR(layer.forward(zeros({2, 4})), "Linear: input of shape [2,4] does not end in in_features=3");
}

}  // namespace
}  // namespace cpf
