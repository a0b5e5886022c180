// The GPT's per-step bf16 parameter copies (framework/nn/compute_copies.h, refreshed by GPT::forward):
// after the first step has learned which parameters run in bf16, later steps take them from the copies,
// remade in one refresh after each optimizer step, and compute bit for bit what a model casting per use
// computes (a fresh model with the same parameters): logits, loss and every gradient, every architecture.
#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "framework/optim/adamw.h"
#include "framework/tensor/ops/copy.h"
#include "models/gpt.h"
#include "models/gpt_input.h"
#include "models/gpt_test_options.h"
#include "support/test_utils.h"

namespace cpf::models {
namespace {

GPTOptions small(AttentionType attention) {
  GPTOptions o = precision_gpt(attention);
  o.compute_dtype = DType::bf16;
  return o;
}

std::vector<std::pair<std::string, GPTOptions>> variants() {
  std::vector<std::pair<std::string, GPTOptions>> out{
      {"mha", small(AttentionType::mha)}, {"gqa", small(AttentionType::gqa)}, {"mla", small(AttentionType::mla)}};
  GPTOptions gpt2 = small(AttentionType::mha);
  gpt2.norm = NormType::layernorm;
  gpt2.positions = PositionType::learned;
  gpt2.max_positions = 16;
  gpt2.bias = true;
  gpt2.tie_embeddings = false;
  out.emplace_back("gpt2-style", gpt2);
  GPTOptions llama = small(AttentionType::gqa);
  llama.mlp = nn::Activation::swiglu;
  out.emplace_back("llama-style", llama);
  return out;
}

GPTInput batch() { return make_prompt_input({{1, 4, 2, 7, 3, 9, 5}, {2, 8, 6, 1, 10}}); }
Tensor labels() { return from_vector<int64_t>({4, 2, 7, 3, 9, 5, -100, 8, 6, 1, 10, -100}, {12}); }

::testing::AssertionResult equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) return ::testing::AssertionFailure() << a.dtype() << " vs " << b.dtype();
  return testing::all_close(a, b, 0.0, 0.0);
}

struct Step {
  Tensor logits, loss;
  std::vector<Tensor> grads;
};

Step step(const GPT& model) {
  for (const Tensor& p : model.parameters()) p.set_grad(Tensor());
  Step s;
  s.logits = model.forward(batch());
  s.loss = GPT::loss(s.logits, labels(), 10);
  backward(s.loss);
  for (const Tensor& p : model.parameters()) s.grads.push_back(p.grad());
  return s;
}

TEST(GPTComputeCopies, LaterStepsUseTheCopiesAndMatchCastingPerUse) {
  for (const auto& [name, options] : variants()) {
    Generator gen(7);
    GPT model(options, &gen);
    optim::AdamW opt(model.named_parameters(), {.lr = 1e-2});
    for (int i = 0; i < 3; ++i) {
      const int64_t before = model.compute_copies().conversions();
      const Step got = step(model);
      // A fresh model with the same parameters casts per use on its first forward.
      Generator other(99);
      GPT fresh(options, &other);
      {
        NoGradGuard guard;
        const auto src = model.named_parameters();
        const auto dst = fresh.named_parameters();
        ASSERT_EQ(src.size(), dst.size());
        for (size_t k = 0; k < src.size(); ++k) raw::copy_(dst[k].second, src[k].second);
      }
      const Step ref = step(fresh);
      EXPECT_TRUE(equal(got.logits, ref.logits)) << name << " step " << i;
      EXPECT_TRUE(equal(got.loss, ref.loss)) << name << " step " << i;
      ASSERT_EQ(got.grads.size(), ref.grads.size());
      for (size_t k = 0; k < got.grads.size(); ++k) {
        ASSERT_EQ(got.grads[k].defined(), ref.grads[k].defined()) << name << " grad " << k;
        if (got.grads[k].defined()) EXPECT_TRUE(equal(got.grads[k], ref.grads[k])) << name << " grad " << k;
      }
      // Step 0 learns (no copies); each later step recasts what the optimizer changed, in one refresh.
      const int64_t made = model.compute_copies().conversions() - before;
      if (i == 0) EXPECT_EQ(made, 0) << name;
      if (i > 0) EXPECT_GT(made, 0) << name << " step " << i;
      opt.step();
    }
  }
}

TEST(GPTComputeCopies, Fp32ModelsMakeNoCopies) {
  GPTOptions o = small(AttentionType::mha);
  o.compute_dtype = std::nullopt;
  Generator gen(3);
  GPT model(o, &gen);
  step(model);
  step(model);
  EXPECT_EQ(model.compute_copies().conversions(), 0);
}

}  // namespace
}  // namespace cpf::models
