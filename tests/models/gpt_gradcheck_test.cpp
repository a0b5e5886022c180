// f64 finite-difference check of the whole GPT: the loss of a packed two-document batch against every
// parameter (a random subset of elements per tensor), for each architecture variant.
#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "models/gpt.h"
#include "models/gpt_input.h"
#include "support/gradcheck_utils.h"

namespace cpf::models {
namespace {

GPTOptions tiny() {
  GPTOptions o;
  o.vocab_size = 7;
  o.hidden_size = 8;
  o.num_layers = 2;
  o.num_heads = 2;
  o.kv_lora_rank = 4;
  o.qk_nope_head_dim = 2;
  o.qk_rope_head_dim = 2;
  o.v_head_dim = 3;
  o.init_std = 0.3;  // large enough that every path carries signal
  o.dtype = DType::f64;
  return o;
}

void expect_model_gradcheck(const GPTOptions& o) {
  Generator gen(11);
  GPT model(o, &gen);
  // Norm gains start at 1 and biases at 0: move them so those gradients are checked at a generic point.
  {
    NoGradGuard guard;
    Generator jitter(5);
    for (const auto& [name, p] : model.named_parameters()) {
      if (p.dim() == 1) add_(p, uniform(p.shape(), -0.3, 0.3, {.dtype = DType::f64}, &jitter));
    }
  }
  const GPTInput in = make_prompt_input({{1, 2, 3, 4}, {5, 6, 0}});
  const Tensor labels = from_vector<int64_t>({2, 3, -100, 5, 6, 0, -100}, {7});
  const std::vector<Tensor> params = model.parameters();
  GradcheckOptions options;
  options.max_elements_per_input = 12;
  EXPECT_GRADCHECK([&](const std::vector<Tensor>&) { return GPT::loss(model.forward(in), labels, 5); }, params,
                   options);
}

TEST(GPTGradcheck, MhaRopeRmsNormGeluTied) { expect_model_gradcheck(tiny()); }

TEST(GPTGradcheck, GqaLearnedLayerNormSwigluUntiedWithBias) {
  GPTOptions o = tiny();
  o.num_heads = 4;
  o.head_dim = 2;
  o.attention = AttentionType::gqa;
  o.num_kv_heads = 2;
  o.positions = PositionType::learned;
  o.max_positions = 8;
  o.norm = NormType::layernorm;
  o.mlp = nn::Activation::swiglu;
  o.tie_embeddings = false;
  o.bias = true;
  expect_model_gradcheck(o);
}

TEST(GPTGradcheck, MlaWithSlidingWindow) {
  GPTOptions o = tiny();
  o.attention = AttentionType::mla;
  o.q_lora_rank = 4;
  o.window = 2;
  expect_model_gradcheck(o);
}

}  // namespace
}  // namespace cpf::models
