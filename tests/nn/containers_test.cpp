// nn::Dropout, nn::Sequential and nn::ModuleList: Dropout's statistics in training, identity in eval,
// seeded masks and the gradient through kept elements; Sequential's order, parameter names and a
// gradcheck through it; ModuleList's names, typed access and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/engine.h"
#include "framework/autograd/ops.h"
#include "framework/nn/dropout.h"
#include "framework/nn/linear.h"
#include "framework/nn/module_list.h"
#include "framework/nn/rms_norm.h"
#include "framework/nn/sequential.h"
#include "support/gradcheck_utils.h"
#include "support/test_utils.h"

namespace cpf::nn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> names_of(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

TEST(Dropout, TrainingZeroesAboutPAndKeepsTheMean) {
  Generator gen(1);
  Dropout dropout(0.3, &gen);
  const Tensor x = ones({200000});
  const std::vector<double> y = dropout.forward(x).to_vector<double>();
  int64_t zeros_seen = 0;
  double sum = 0;
  for (double v : y) {
    if (v == 0) {
      ++zeros_seen;
    } else {
      EXPECT_NEAR(v, 1.0 / 0.7, 1e-6);  // kept elements are scaled by 1 / (1 - p)
    }
    sum += v;
  }
  const double n = static_cast<double>(y.size());
  // Binomial(200000, 0.3): std ~ 205 zeros; 5 sigma bounds.
  EXPECT_NEAR(static_cast<double>(zeros_seen) / n, 0.3, 5 * std::sqrt(0.3 * 0.7 / n));
  EXPECT_NEAR(sum / n, 1.0, 0.01);
}

TEST(Dropout, EvalIsTheIdentityAndPZeroKeepsEverything) {
  Generator gen(2);
  Dropout dropout(0.5, &gen);
  const Tensor x = testing::random_tensor({4, 5}, DType::f32, 3);
  dropout.eval();
  const Tensor y = dropout.forward(x);
  EXPECT_EQ(y.impl(), x.impl());  // the very same tensor
  dropout.train();
  EXPECT_NE(dropout.forward(x).to_vector<float>(), x.to_vector<float>());
  Dropout none(0.0, &gen);
  EXPECT_EQ(none.forward(x).impl(), x.impl());
}

TEST(Dropout, SameSeedSameMaskAndTheGradientFollowsTheMask) {
  Generator a(7), b(7);
  Dropout da(0.5, &a), db(0.5, &b);
  const Tensor x = testing::grad_input({64}, 4);
  const Tensor ya = da.forward(x);
  EXPECT_EQ(ya.to_vector<double>(), db.forward(x).to_vector<double>());
  backward(sum(ya));
  const std::vector<double> g = x.grad().to_vector<double>(), yv = ya.to_vector<double>(), xv = x.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    // Kept: y = 2x, dy/dx = 2; dropped: y = 0, dy/dx = 0.
    EXPECT_DOUBLE_EQ(g[i], yv[i] == 0 ? 0.0 : 2.0) << i;
    if (yv[i] != 0) EXPECT_DOUBLE_EQ(yv[i], 2 * xv[i]);
  }
}

TEST(Dropout, RefusesBadProbabilitiesAndInputs) {
  EXPECT_CPF_ERROR(Dropout(1.0), "Dropout: p=1 must be in [0, 1)");
  EXPECT_CPF_ERROR(Dropout(-0.1), "Dropout: p=-0.1 must be in [0, 1)");
  EXPECT_CPF_ERROR(Dropout(std::nan("")), "must be in [0, 1)");
  Dropout d(0.5);
  EXPECT_CPF_ERROR(d.forward(zeros({3}, {.dtype = DType::i64})), "Dropout: needs a floating-point input, got i64");
  EXPECT_CPF_ERROR(d.forward(Tensor()), "Dropout: the input is undefined");
}

TEST(Sequential, RunsStagesInOrderWithTorchStyleNames) {
  Generator gen(5);
  Sequential net;
  auto fc1 =
      net.add(std::make_shared<Linear>(LinearOptions{.in_features = 3, .out_features = 4, .dtype = DType::f64}, &gen));
  net.add("tanh", [](const Tensor& x) { return tanh(x); });
  auto fc2 =
      net.add(std::make_shared<Linear>(LinearOptions{.in_features = 4, .out_features = 2, .dtype = DType::f64}, &gen));
  EXPECT_EQ(net.size(), 3u);
  EXPECT_THAT(names_of(net), ElementsAre("0.weight", "0.bias", "2.weight", "2.bias"));
  const Tensor x = testing::random_tensor({5, 3}, DType::f64, 6);
  const Tensor expected = fc2->forward(tanh(fc1->forward(x)));
  EXPECT_TRUE(testing::all_close(net.forward(x), expected, 0, 0));
  // train()/eval() reach the stages.
  auto drop = net.add(std::make_shared<Dropout>(0.5, &gen));
  net.eval();
  EXPECT_FALSE(drop->is_training());
  EXPECT_TRUE(testing::all_close(net.forward(x), expected, 0, 0));
  EXPECT_TRUE(testing::all_close(Sequential().forward(x), x, 0, 0));  // empty: the input
}

TEST(Sequential, Gradcheck) {
  Generator gen(8);
  Sequential net;
  net.add(std::make_shared<Linear>(LinearOptions{.in_features = 3, .out_features = 4, .dtype = DType::f64}, &gen));
  net.add("gelu", [](const Tensor& x) { return gelu(x); });
  net.add(std::make_shared<RMSNorm>(RMSNormOptions{.dim = 4, .dtype = DType::f64}));
  net.add(std::make_shared<Linear>(LinearOptions{.in_features = 4, .out_features = 2, .dtype = DType::f64}, &gen));
  std::vector<Tensor> inputs{testing::grad_input({2, 3}, 9)};
  for (const Tensor& p : net.parameters()) inputs.push_back(p);
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return net.forward(in[0]); }, inputs);
}

TEST(Sequential, RefusesEmptyStagesAndNamesAStageThatFails) {
  Sequential net;
  EXPECT_CPF_ERROR(net.add("nothing", Sequential::Function()), "function stage 'nothing' (stage 0) is empty");
  EXPECT_CPF_ERROR(net.add("", [](const Tensor& x) { return x; }), "function stage 0 needs a name");
  EXPECT_CPF_ERROR(net.add(std::shared_ptr<Linear>()), "Sequential: stage 0 is a null module");
  net.add("broken", [](const Tensor&) { return Tensor(); });
  EXPECT_CPF_ERROR(net.forward(zeros({2})), "Sequential: stage 0 ('broken') returned an undefined tensor");
}

TEST(ModuleList, IndexedChildrenWithTypedAccess) {
  Generator gen(10);
  struct Holder : Module {
    std::shared_ptr<ModuleList> layers = register_module("layers", std::make_shared<ModuleList>());
  } holder;
  for (int i = 0; i < 3; ++i) {
    holder.layers->push_back(std::make_shared<Linear>(LinearOptions{.in_features = 2, .out_features = 2}, &gen));
  }
  holder.layers->push_back(std::make_shared<Dropout>(0.1, &gen));
  EXPECT_EQ(holder.layers->size(), 4u);
  EXPECT_THAT(names_of(holder), ElementsAre("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                                            "layers.2.weight", "layers.2.bias"));
  EXPECT_EQ(holder.layers->at<Linear>(1)->options().in_features, 2);
  int count = 0;
  for (const auto& m : *holder.layers) count += m != nullptr;
  EXPECT_EQ(count, 4);
  holder.eval();
  EXPECT_FALSE(holder.layers->at<Dropout>(3)->is_training());
  EXPECT_CPF_ERROR(holder.layers->at(4), "ModuleList: index 4 is out of range for a list of 4 modules");
  EXPECT_CPF_ERROR(holder.layers->at<Linear>(3), "ModuleList: entry 3 is not of the requested module type");
  EXPECT_CPF_ERROR(holder.layers->as<Linear>(), "entry 3 is not of the requested module type");
}

}  // namespace
}  // namespace cpf::nn
