#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "framework/autograd/ops.h"
#include "framework/nn/mlp.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

// Row-major y = x W^T (+ b) with plain loops.
std::vector<double> naive_linear(const std::vector<double>& x, int64_t rows, const Tensor& w, const Tensor& b) {
  const int64_t out = w.size(0), in = w.size(1);
  const auto wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(out, 0.0);
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = bv[o];
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * wv[o * in + i];
      y[r * out + o] = acc;
    }
  }
  return y;
}

double naive_gelu(double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }

std::map<std::string, Tensor> params_of(const nn::Module& m) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : m.named_parameters()) out[name] = t;
  return out;
}

TEST(MLP, GeluMatchesNaiveReference) {
  nn::MLP mlp({.hidden_size = 4,
               .intermediate_size = 6,
               .activation = nn::Activation::gelu,
               .bias = true,
               .dtype = DType::f64});
  auto p = params_of(mlp);
  ASSERT_EQ(p.size(), 4u);
  Tensor x = random_tensor({3, 4}, DType::f64, 5, -2, 2);
  auto h = naive_linear(x.to_vector<double>(), 3, p["fc_in.weight"], p["fc_in.bias"]);
  for (double& v : h) v = naive_gelu(v);
  const auto y = naive_linear(h, 3, p["fc_out.weight"], p["fc_out.bias"]);
  EXPECT_TRUE(all_close(mlp.forward(x), from_vector(y, {3, 4}), 1e-12, 1e-10));
}

TEST(MLP, SwigluMatchesNaiveReference) {
  nn::MLP mlp({.hidden_size = 4, .intermediate_size = 5, .activation = nn::Activation::swiglu, .dtype = DType::f64});
  auto p = params_of(mlp);
  ASSERT_EQ(p.size(), 3u);  // no biases
  Tensor x = random_tensor({2, 2, 4}, DType::f64, 9, -2, 2);
  const auto gate = naive_linear(x.to_vector<double>(), 4, p["gate_proj.weight"], Tensor());
  const auto up = naive_linear(x.to_vector<double>(), 4, p["up_proj.weight"], Tensor());
  std::vector<double> h(gate.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
  const auto y = naive_linear(h, 4, p["down_proj.weight"], Tensor());
  EXPECT_TRUE(all_close(mlp.forward(x), from_vector(y, {2, 2, 4}), 1e-12, 1e-10));
}

TEST(MLP, SwigluFusedProjectionMatchesTheUnfusedGraph) {
  // 160 rows: gate_proj and up_proj run as one GEMM (linear_cat's fused path) and the gate as
  // swiglu_packed; the output and every parameter gradient equal the unfused ops' graph.
  nn::MLP mlp({.hidden_size = 4,
               .intermediate_size = 6,
               .activation = nn::Activation::swiglu,
               .bias = true,
               .dtype = DType::f64});
  auto p = params_of(mlp);
  ASSERT_EQ(p.size(), 6u);
  const Tensor x = random_tensor({2, 80, 4}, DType::f64, 13, -2, 2);
  const Tensor probe = random_tensor({2, 80, 4}, DType::f64, 14);
  const Tensor y = mlp.forward(x);
  backward(sum(mul(y, probe)));
  std::map<std::string, Tensor> fused_grads;
  for (auto& [name, t] : p) fused_grads[name] = t.grad();
  std::map<std::string, Tensor> leaves;
  for (auto& [name, t] : p) {
    leaves[name] = t.detach();
    leaves[name].set_requires_grad(true);
  }
  const Tensor gate = linear(x, leaves["gate_proj.weight"], leaves["gate_proj.bias"]);
  const Tensor up = linear(x, leaves["up_proj.weight"], leaves["up_proj.bias"]);
  const Tensor ref = linear(mul(silu(gate), up), leaves["down_proj.weight"], leaves["down_proj.bias"]);
  EXPECT_TRUE(all_close(y, ref, 1e-13, 1e-12));
  backward(sum(mul(ref, probe)));
  for (auto& [name, t] : leaves) {
    ASSERT_TRUE(fused_grads[name].defined()) << name;
    EXPECT_TRUE(all_close(fused_grads[name], t.grad(), 1e-12, 1e-11)) << name;
  }
}

TEST(MLP, OutputProjectionGetsItsOwnInitStd) {
  Generator gen(3);
  nn::MLP mlp({.hidden_size = 64, .intermediate_size = 256, .init_std = 0.02, .out_init_std = 0.002}, &gen);
  auto p = params_of(mlp);
  auto std_of = [](const Tensor& t) {
    double sq = 0;
    for (double v : t.to_vector<double>()) sq += v * v;
    return std::sqrt(sq / t.numel());
  };
  EXPECT_NEAR(std_of(p["fc_in.weight"]), 0.02, 0.001);
  EXPECT_NEAR(std_of(p["fc_out.weight"]), 0.002, 0.0001);
}

TEST(MLP, RejectsBadOptionsAndInputs) {
  EXPECT_CPF_ERROR(nn::MLP({.hidden_size = 4, .intermediate_size = 0}),
                   "MLP: hidden_size=4 and intermediate_size=0 must be positive");
  EXPECT_CPF_ERROR(nn::MLP({.hidden_size = 4, .intermediate_size = 8, .init_std = -1}),
                   "MLP: init_std=-1 and out_init_std=0 must be finite and >= 0");
  nn::MLP mlp({.hidden_size = 4, .intermediate_size = 8});
  EXPECT_CPF_ERROR(mlp.forward(zeros({2, 3})), "MLP: input of shape [2,3] does not end in hidden_size=4");
  EXPECT_STREQ(nn::activation_name(nn::Activation::swiglu), "swiglu");
}

}  // namespace
}  // namespace cpf
