// MultiHeadAttention and MultiHeadLatentAttention: parameters, wiring against a hand composition of
// the same weights with the naive attention, format equivalences, causality, THD packing, the CP
// group guard and option validation.
#include <gtest/gtest.h>

#include <type_traits>

#include <mutex>

#include "attention/nn/multi_head_attention.h"
#include "attention/nn/multi_head_latent_attention.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/launcher.h"
#include "framework/tensor/ops/views.h"
#include "tests/attention/attention_support.h"
#include "tests/attention/nn/module_parameters.h"

namespace cpf {
namespace {

// The modules live in cpf::nn (the cpf:: names are deprecated aliases, tested below).
using nn::MultiHeadAttention;
using nn::MultiHeadAttentionOptions;
using nn::MultiHeadLatentAttention;
using nn::MultiHeadLatentAttentionOptions;

using testing::all_close;
using testing::random_tensor;

using testing::linear;
using testing::param;

Tensor heads(const Tensor& x, int64_t h, int64_t d) { return reshape(x, {x.size(0), x.size(1), h, d}); }

MultiHeadAttentionOptions mha_options(QkvFormat format, int64_t kv_heads) {
  return {.hidden_size = 12,
          .num_heads = 4,
          .num_kv_heads = kv_heads,
          .head_dim = 4,
          .qkv_format = format,
          .rotary_dim = 2,
          .dtype = DType::f64};
}

TEST(MultiHeadAttention, ParametersAndHandComposition) {
  Generator gen(7);
  const MultiHeadAttention mha(mha_options(QkvFormat::bshd, 2), &gen);
  std::vector<std::string> names;
  for (const auto& [n, t] : mha.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}));
  EXPECT_EQ(param(mha, "k_proj.weight").shape(), (Shape{8, 12}));
  EXPECT_EQ(param(mha, "o_proj.weight").shape(), (Shape{12, 16}));

  const Tensor x = random_tensor({2, 5, 12}, DType::f64, 1);
  const Tensor pos = arange(5);
  const Tensor q = rope(heads(linear(mha, "q_proj", x), 4, 4), pos, 10000.0, 2);
  const Tensor k = rope(heads(linear(mha, "k_proj", x), 2, 4), pos, 10000.0, 2);
  const Tensor v = heads(linear(mha, "v_proj", x), 2, 4);
  const Tensor attn = testing::naive_attention(q, k, v, mha.spec(), std::nullopt).out;
  const Tensor want = linear(mha, "o_proj", reshape(attn, {2, 5, 16}));
  EXPECT_TRUE(all_close(mha.forward(x), want, 1e-12, 1e-12));
}

TEST(MultiHeadAttention, FusedProjectionMatchesHandCompositionWithGradients) {
  // 140 rows: q/k/v come from one GEMM (linear_cat's fused path) split into views; GQA and RoPE as in
  // a Llama block. Output, input gradient and every parameter gradient equal the hand composition.
  Generator gen(8);
  MultiHeadAttention mha(mha_options(QkvFormat::bshd, 2), &gen);
  const Tensor probe = random_tensor({2, 70, 12}, DType::f64, 3);
  auto run = [&](bool module) {
    Tensor x = random_tensor({2, 70, 12}, DType::f64, 2);
    x.set_requires_grad(true);
    Tensor y;
    if (module) {
      y = mha.forward(x);
    } else {
      const Tensor pos = arange(70);
      const Tensor q = rope(heads(linear(mha, "q_proj", x), 4, 4), pos, 10000.0, 2);
      const Tensor k = rope(heads(linear(mha, "k_proj", x), 2, 4), pos, 10000.0, 2);
      const Tensor v = heads(linear(mha, "v_proj", x), 2, 4);
      const Tensor attn = dot_product_attention(q, k, v, mha.spec(), std::nullopt).out;
      y = linear(mha, "o_proj", reshape(attn, {2, 70, 16}));
    }
    mha.zero_grad();
    backward(sum(mul(y, probe)));
    std::vector<Tensor> out{y.detach(), x.grad()};
    for (const auto& [n, t] : mha.named_parameters()) out.push_back(t.grad());
    return out;
  };
  const std::vector<Tensor> got = run(true), want = run(false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].defined() && want[i].defined()) << "entry " << i;
    EXPECT_TRUE(all_close(got[i], want[i], 1e-12, 1e-11)) << "entry " << i;
  }
}

TEST(MultiHeadAttention, SbhdAndThdMatchBshd) {
  for (int64_t kv_heads : {4, 2, 1}) {  // MHA, GQA, MQA
    Generator g1(3), g2(3), g3(3);
    const MultiHeadAttention bshd(mha_options(QkvFormat::bshd, kv_heads), &g1);
    const MultiHeadAttention sbhd(mha_options(QkvFormat::sbhd, kv_heads), &g2);
    const MultiHeadAttention thd(mha_options(QkvFormat::thd, kv_heads), &g3);
    const Tensor x = random_tensor({2, 6, 12}, DType::f64, 2);
    const Tensor ref = bshd.forward(x);
    EXPECT_TRUE(all_close(permute(sbhd.forward(permute(x, {1, 0, 2})), {1, 0, 2}), ref, 1e-12, 1e-12));
    // thd: the two rows packed with one padding token between them; RoPE restarts per sequence.
    const Tensor packed = zeros({13, 12}, {.dtype = DType::f64});
    raw::copy_(raw::narrow(packed, 0, 0, 6), raw::select(x, 0, 0));
    raw::copy_(raw::narrow(packed, 0, 7, 6), raw::select(x, 0, 1));
    const Tensor y = thd.forward(packed, SequenceInfo::from_cu_seqlens({0, 6, 12}, {0, 7, 13}));
    EXPECT_TRUE(all_close(raw::narrow(y, 0, 0, 6), raw::select(ref, 0, 0), 1e-12, 1e-12));
    EXPECT_TRUE(all_close(raw::narrow(y, 0, 7, 6), raw::select(ref, 0, 1), 1e-12, 1e-12));
  }
}

TEST(MultiHeadAttention, CausalOutputsIgnoreFutureTokens) {
  Generator gen(5);
  const MultiHeadAttention mha(mha_options(QkvFormat::bshd, 1), &gen);
  const Tensor x = random_tensor({1, 6, 12}, DType::f64, 3);
  Tensor changed = raw::clone(x);
  raw::copy_(raw::narrow(changed, 1, 4, 2), random_tensor({1, 2, 12}, DType::f64, 4));
  EXPECT_TRUE(all_close(raw::narrow(mha.forward(changed), 1, 0, 4), raw::narrow(mha.forward(x), 1, 0, 4), 1e-14, 0));
}

MultiHeadLatentAttentionOptions mla_options(int64_t q_lora_rank) {
  return {.hidden_size = 10,
          .num_heads = 3,
          .q_lora_rank = q_lora_rank,
          .kv_lora_rank = 5,
          .qk_nope_head_dim = 3,
          .qk_rope_head_dim = 2,
          .v_head_dim = 4,
          .dtype = DType::f64};
}

TEST(MultiHeadLatentAttention, ParametersFollowDeepSeekNames) {
  const MultiHeadLatentAttention with_lora(mla_options(6));
  std::vector<std::string> names;
  for (const auto& [n, t] : with_lora.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight",
                                             "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                                             "o_proj.weight"}));
  EXPECT_EQ(param(with_lora, "q_b_proj.weight").shape(), (Shape{15, 6}));
  EXPECT_EQ(param(with_lora, "kv_a_proj_with_mqa.weight").shape(), (Shape{7, 10}));
  EXPECT_EQ(param(with_lora, "kv_b_proj.weight").shape(), (Shape{21, 5}));
  EXPECT_EQ(param(with_lora, "o_proj.weight").shape(), (Shape{10, 12}));
  EXPECT_EQ(with_lora.spec().head_dim_qk, 5);
  EXPECT_EQ(with_lora.spec().head_dim_v, 4);
  const MultiHeadLatentAttention direct(mla_options(0));
  EXPECT_EQ(direct.named_parameters()[0].first, "q_proj.weight");
  EXPECT_EQ(direct.named_parameters().size(), 5u);
}

TEST(MultiHeadLatentAttention, HandCompositionWithSharedRopeKey) {
  Generator gen(11);
  const MultiHeadLatentAttention mla(mla_options(6), &gen);
  const Tensor x = random_tensor({2, 5, 10}, DType::f64, 1);
  const Tensor pos = arange(5);
  const Tensor cq = rms_norm(linear(mla, "q_a_proj", x), param(mla, "q_a_layernorm.weight"), 1e-6);
  const Tensor q = heads(linear(mla, "q_b_proj", cq), 3, 5);  // (2, 5, 3, 5)
  const Tensor q_full = cat({narrow(q, -1, 0, 3), rope(narrow(q, -1, 3, 2), pos)}, -1);
  const Tensor kv_a = linear(mla, "kv_a_proj_with_mqa", x);  // (2, 5, 7)
  const Tensor c_kv = rms_norm(narrow(kv_a, -1, 0, 5), param(mla, "kv_a_layernorm.weight"), 1e-6);
  const Tensor kv = heads(linear(mla, "kv_b_proj", c_kv), 3, 7);  // (2, 5, 3, 7)
  // The decoupled key: one rotated vector per token, identical for all three heads.
  const Tensor k_pe = rope(unsqueeze(narrow(kv_a, -1, 5, 2), 2), pos);  // (2, 5, 1, 2)
  const Tensor k_full = cat({narrow(kv, -1, 0, 3), expand(k_pe, {2, 5, 3, 2})}, -1);
  const Tensor attn = testing::naive_attention(q_full, k_full, narrow(kv, -1, 3, 4), mla.spec(), std::nullopt).out;
  const Tensor want = linear(mla, "o_proj", reshape(attn, {2, 5, 12}));
  EXPECT_TRUE(all_close(mla.forward(x), want, 1e-12, 1e-12));
}

TEST(MultiHeadLatentAttention, ThdWithPaddingMatchesBshd) {
  Generator g1(4), g2(4);
  MultiHeadLatentAttentionOptions opts = mla_options(0);
  const MultiHeadLatentAttention bshd(opts, &g1);
  opts.qkv_format = QkvFormat::thd;
  opts.mask = MaskType::padding_causal;
  const MultiHeadLatentAttention thd(opts, &g2);
  const Tensor x = random_tensor({1, 4, 10}, DType::f64, 2);
  const Tensor packed = zeros({6, 10}, {.dtype = DType::f64});
  raw::copy_(raw::narrow(packed, 0, 2, 4), raw::select(x, 0, 0));
  // An empty first sequence in a slot of 2, then the real one.
  const Tensor y = thd.forward(packed, SequenceInfo::from_cu_seqlens({0, 0, 4}, {0, 2, 6}));
  EXPECT_TRUE(all_close(raw::narrow(y, 0, 2, 4), raw::select(bshd.forward(x), 0, 0), 1e-12, 1e-12));
}

TEST(AttentionModules, RejectBadOptionsAndInputs) {
  EXPECT_CPF_ERROR(MultiHeadAttention({.hidden_size = 12, .num_heads = 4, .num_kv_heads = 3}),
                   "MultiHeadAttention: num_heads must be a multiple of num_kv_heads: num_heads=4 num_kv_heads=3");
  EXPECT_CPF_ERROR(MultiHeadAttention({.hidden_size = 10, .num_heads = 4}),
                   "hidden_size=10 is not a multiple of num_heads=4; set head_dim explicitly");
  EXPECT_CPF_ERROR(MultiHeadAttention({.hidden_size = 0, .num_heads = 4}),
                   "hidden_size and num_heads must be positive: hidden_size=0 num_heads=4");
  EXPECT_CPF_ERROR(MultiHeadAttention({.hidden_size = 12, .num_heads = 2, .rotary_dim = 3}),
                   "rotary_dim must be even and in (0, head_dim]: rotary_dim=3 head_dim=6");
  EXPECT_CPF_ERROR(MultiHeadAttention({.hidden_size = 12, .num_heads = 2, .window = {4, 1}}),
                   "mask causal sees no keys after the query");
  const MultiHeadAttention mha(mha_options(QkvFormat::thd, 2));
  EXPECT_CPF_ERROR(mha.forward(random_tensor({2, 6, 12}, DType::f64)),
                   "MultiHeadAttention: qkv_format thd expects (tokens, hidden) inputs with hidden = 12: x=[2,6,12]");
  EXPECT_CPF_ERROR(mha.forward(random_tensor({6, 12}, DType::f64)), "qkv_format thd needs a SequenceInfo");
  EXPECT_CPF_ERROR(MultiHeadLatentAttention(
                       {.hidden_size = 8, .num_heads = 2, .kv_lora_rank = 0, .qk_rope_head_dim = 2, .v_head_dim = 4}),
                   "MultiHeadLatentAttention: hidden_size, num_heads, kv_lora_rank, qk_rope_head_dim and v_head_dim "
                   "must be positive");
  EXPECT_CPF_ERROR(MultiHeadLatentAttention(
                       {.hidden_size = 8, .num_heads = 2, .kv_lora_rank = 4, .qk_rope_head_dim = 3, .v_head_dim = 4}),
                   "qk_rope_head_dim must be even (RoPE rotates pairs): qk_rope_head_dim=3");
  const MultiHeadLatentAttention mla(mla_options(0));
  EXPECT_CPF_ERROR(mla.forward(random_tensor({2, 6, 9}, DType::f64)),
                   "MultiHeadLatentAttention: qkv_format bshd expects (batch, seq, hidden) inputs with hidden = 10");
}

// The names before the move to cpf::nn stay for one release, as deprecated aliases of the same types.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static_assert(std::is_same_v<cpf::MultiHeadAttention, nn::MultiHeadAttention>);
static_assert(std::is_same_v<cpf::MultiHeadAttentionOptions, nn::MultiHeadAttentionOptions>);
static_assert(std::is_same_v<cpf::MultiHeadLatentAttention, nn::MultiHeadLatentAttention>);
static_assert(std::is_same_v<cpf::MultiHeadLatentAttentionOptions, nn::MultiHeadLatentAttentionOptions>);
#pragma GCC diagnostic pop

}  // namespace
}  // namespace cpf
