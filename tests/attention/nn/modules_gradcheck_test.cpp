// f64 gradcheck of both attention modules with respect to the input and every parameter.
#include <gtest/gtest.h>

#include "attention/nn/multi_head_attention.h"
#include "attention/nn/multi_head_latent_attention.h"
#include "framework/autograd/ops.h"
#include "support/gradcheck_utils.h"
#include "tests/attention/nn/module_parameters.h"

namespace cpf {
namespace {

// The modules live in cpf::nn (the cpf:: names are deprecated aliases, tested below).
using nn::MultiHeadAttention;
using nn::MultiHeadAttentionOptions;
using nn::MultiHeadLatentAttention;
using nn::MultiHeadLatentAttentionOptions;

using Inputs = std::vector<Tensor>;

using testing::with_parameters;

TEST(AttentionModulesGradcheck, MultiHeadAttentionGqaCausal) {
  Generator gen(1);
  const MultiHeadAttention mha({.hidden_size = 6,
                                .num_heads = 4,
                                .num_kv_heads = 2,
                                .head_dim = 2,
                                .window = {2, 0},
                                .bias = true,
                                .dtype = DType::f64},
                               &gen);
  const Tensor x = testing::grad_input({2, 4, 6}, 2);
  EXPECT_GRADCHECK([&](const Inputs& in) { return mha.forward(in[0]); }, with_parameters(x, mha));
}

TEST(AttentionModulesGradcheck, MultiHeadAttentionThdPadding) {
  Generator gen(3);
  const MultiHeadAttention mha({.hidden_size = 4,
                                .num_heads = 2,
                                .num_kv_heads = 1,
                                .qkv_format = QkvFormat::thd,
                                .mask = MaskType::padding,
                                .dtype = DType::f64},
                               &gen);
  const SequenceInfo seq = SequenceInfo::from_cu_seqlens({0, 3, 5}, {0, 4, 7});
  const Tensor x = testing::grad_input({7, 4}, 4);
  EXPECT_GRADCHECK([&](const Inputs& in) { return mha.forward(in[0], seq); }, with_parameters(x, mha));
}

TEST(AttentionModulesGradcheck, MultiHeadLatentAttentionWithAndWithoutQLowRank) {
  for (int64_t q_lora_rank : {0, 3}) {
    Generator gen(5);
    const MultiHeadLatentAttention mla({.hidden_size = 5,
                                        .num_heads = 2,
                                        .q_lora_rank = q_lora_rank,
                                        .kv_lora_rank = 3,
                                        .qk_nope_head_dim = 2,
                                        .qk_rope_head_dim = 2,
                                        .v_head_dim = 3,
                                        .qkv_format = QkvFormat::sbhd,
                                        .dtype = DType::f64},
                                       &gen);
    const Tensor x = testing::grad_input({4, 2, 5}, 6);
    EXPECT_GRADCHECK([&](const Inputs& in) { return mla.forward(in[0]); }, with_parameters(x, mla));
  }
}

}  // namespace
}  // namespace cpf
