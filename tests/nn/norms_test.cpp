#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/rms_norm.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

// Naive references over rows of the last dim.
Tensor naive_rms(const Tensor& x, const std::vector<double>& w, double eps) {
  const int64_t c = x.size(-1), rows = x.numel() / c;
  auto v = x.to_vector<double>();
  std::vector<double> out(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < c; ++i) ms += v[r * c + i] * v[r * c + i];
    const double scale = 1.0 / std::sqrt(ms / c + eps);
    for (int64_t i = 0; i < c; ++i) out[r * c + i] = v[r * c + i] * scale * w[i];
  }
  return from_vector(out, x.shape());
}

Tensor naive_layer(const Tensor& x, const std::vector<double>& w, const std::vector<double>& b, double eps) {
  const int64_t c = x.size(-1), rows = x.numel() / c;
  auto v = x.to_vector<double>();
  std::vector<double> out(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < c; ++i) mean += v[r * c + i];
    mean /= c;
    for (int64_t i = 0; i < c; ++i) var += (v[r * c + i] - mean) * (v[r * c + i] - mean);
    const double rstd = 1.0 / std::sqrt(var / c + eps);
    for (int64_t i = 0; i < c; ++i) out[r * c + i] = (v[r * c + i] - mean) * rstd * w[i] + (b.empty() ? 0 : b[i]);
  }
  return from_vector(out, x.shape());
}

TEST(RMSNorm, MatchesNaiveReferenceAndStartsAtUnitWeight) {
  nn::RMSNorm norm({.dim = 6, .eps = 1e-6, .dtype = DType::f64});
  ASSERT_EQ(norm.named_parameters().size(), 1u);
  EXPECT_EQ(norm.weight().to_vector<double>(), std::vector<double>(6, 1.0));
  Tensor x = random_tensor({2, 3, 6});
  EXPECT_TRUE(all_close(norm.forward(x), naive_rms(x, std::vector<double>(6, 1.0), 1e-6), 1e-12, 1e-12));
  // A trained weight scales each channel.
  NoGradGuard guard;
  copy_(norm.weight(), from_vector<double>({1, 2, 3, -1, 0.5, 0}, {6}));
  EXPECT_TRUE(all_close(norm.forward(x), naive_rms(x, {1, 2, 3, -1, 0.5, 0}, 1e-6), 1e-12, 1e-12));
}

TEST(LayerNorm, MatchesNaiveReferenceWithAndWithoutBias) {
  nn::LayerNorm with_bias({.dim = 5, .eps = 1e-5, .dtype = DType::f64});
  nn::LayerNorm no_bias({.dim = 5, .eps = 1e-5, .bias = false, .dtype = DType::f64});
  ASSERT_EQ(with_bias.named_parameters().size(), 2u);
  EXPECT_EQ(with_bias.named_parameters()[1].first, "bias");
  ASSERT_EQ(no_bias.named_parameters().size(), 1u);
  EXPECT_FALSE(no_bias.bias().defined());
  NoGradGuard guard;
  copy_(with_bias.bias(), from_vector<double>({0.1, 0.2, 0.3, 0.4, 0.5}, {5}));
  Tensor x = random_tensor({4, 5}, DType::f64, 3);
  EXPECT_TRUE(all_close(with_bias.forward(x),
                        naive_layer(x, std::vector<double>(5, 1.0), {0.1, 0.2, 0.3, 0.4, 0.5}, 1e-5), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(no_bias.forward(x), naive_layer(x, std::vector<double>(5, 1.0), {}, 1e-5), 1e-12, 1e-12));
}

TEST(Norms, RejectBadOptionsAndInputs) {
  EXPECT_CPF_ERROR(nn::RMSNorm({.dim = 0}), "RMSNorm: dim=0 must be positive");
  EXPECT_CPF_ERROR(nn::RMSNorm({.dim = 4, .eps = 0}), "RMSNorm: eps=0 must be positive");
  EXPECT_CPF_ERROR(nn::RMSNorm({.dim = 4, .dtype = DType::i32}), "RMSNorm: dtype must be floating");
  EXPECT_CPF_ERROR(nn::LayerNorm({.dim = -2}), "LayerNorm: dim=-2 must be positive");
  EXPECT_CPF_ERROR(nn::LayerNorm({.dim = 4, .eps = -1}), "LayerNorm: eps=-1 must be positive");
  EXPECT_CPF_ERROR(nn::LayerNorm({.dim = 4, .dtype = DType::i64}), "LayerNorm: dtype must be floating");
  nn::RMSNorm rms({.dim = 4});
  nn::LayerNorm ln({.dim = 4});
  EXPECT_CPF_ERROR(rms.forward(zeros({2, 3})), "RMSNorm: input of shape [2,3] does not end in dim=4");
  EXPECT_CPF_ERROR(ln.forward(zeros({2, 5})), "LayerNorm: input of shape [2,5] does not end in dim=4");
}

}  // namespace
}  // namespace cpf
