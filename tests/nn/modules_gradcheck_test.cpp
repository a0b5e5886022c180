// f64 finite-difference checks of the nn modules: inputs and every parameter (gradcheck perturbs
// parameters in place, so passing the module's own handles checks them).
#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "framework/nn/embedding.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/mlp.h"
#include "framework/nn/rms_norm.h"
#include "support/gradcheck_utils.h"

namespace cpf {
namespace {

using testing::grad_input;

std::vector<Tensor> with_params(Tensor x, const nn::Module& m) {
  std::vector<Tensor> inputs{std::move(x)};
  for (const Tensor& p : m.parameters()) inputs.push_back(p);
  return inputs;
}

// Moves parameters away from their ones/zeros init so the check covers a generic point.
void randomize(const nn::Module& m, uint64_t seed) {
  NoGradGuard guard;
  for (const Tensor& p : m.parameters()) copy_(p, testing::random_tensor(p.shape(), DType::f64, seed++, -1, 1));
}

TEST(ModulesGradcheck, Embedding) {
  nn::Embedding emb({.num_embeddings = 5, .embedding_dim = 3, .dtype = DType::f64});
  Tensor ids = from_vector<int64_t>({4, 0, 4, 2}, {2, 2});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>&) { return emb.forward(ids); }, emb.parameters());
}

TEST(ModulesGradcheck, RMSNorm) {
  nn::RMSNorm norm({.dim = 5, .dtype = DType::f64});
  randomize(norm, 11);
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return norm.forward(in[0]); },
                   with_params(grad_input({3, 5}), norm));
}

TEST(ModulesGradcheck, LayerNorm) {
  nn::LayerNorm norm({.dim = 4, .dtype = DType::f64});
  randomize(norm, 21);
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return norm.forward(in[0]); },
                   with_params(grad_input({2, 3, 4}), norm));
}

TEST(ModulesGradcheck, MLPGelu) {
  nn::MLP mlp({.hidden_size = 4,
               .intermediate_size = 6,
               .activation = nn::Activation::gelu,
               .bias = true,
               .dtype = DType::f64});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return mlp.forward(in[0]); },
                   with_params(grad_input({3, 4}), mlp));
}

TEST(ModulesGradcheck, MLPSwiglu) {
  nn::MLP mlp({.hidden_size = 4, .intermediate_size = 5, .activation = nn::Activation::swiglu, .dtype = DType::f64});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return mlp.forward(in[0]); },
                   with_params(grad_input({2, 2, 4}), mlp));
}

}  // namespace
}  // namespace cpf
