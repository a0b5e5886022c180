// run.precision: fp8 inside the GPT (GPTOptions::fp8_linears, delayed scaling): the FP8 GEMMs are exactly
// the transformer blocks' projections whose shapes fit (their call sites keyed "blocks.i.fp8_k", the same
// count in every block, nothing outside the blocks: the embedding, the final norm and the LM head stay
// bf16), each recording the amax of its input, weight and output gradient; a projection whose width is
// not a multiple of 16 (MLA's latent) stays bf16; a recomputed block reuses its slots and, inside a
// training step's scope, the FP8 weight copies its forward made.
#include <gtest/gtest.h>

#include <set>

#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "models/gpt.h"
#include "models/gpt_input.h"
#include "models/gpt_test_options.h"
#include "support/test_utils.h"

namespace cpf::models {
namespace {

GPTOptions fp8_gpt(AttentionType attention) {
  GPTOptions o = precision_gpt(attention);
  o.compute_dtype = DType::bf16;
  o.fp8_linears = true;
  o.fp8_scaling = {.recipe = Fp8Recipe::delayed, .amax_history = 4};
  return o;
}

// 16 tokens: the FP8 GEMM takes rows in multiples of 16.
GPTInput batch() { return make_prompt_input({{1, 4, 2, 7, 3, 9, 5, 8, 6, 1, 10, 2, 3, 4, 5, 6}}); }

// The FP8 call sites of each block after one forward and backward.
std::vector<std::vector<std::string>> sites_per_block(const GPT& model) {
  Tensor loss = GPT::loss(model.forward(batch()), from_vector<int64_t>(std::vector<int64_t>(16, 3), {16}), 16);
  backward(loss);
  std::vector<std::vector<std::string>> out(model.options().num_layers);
  for (const std::string& key : model.fp8_scaling()->keys()) {
    EXPECT_EQ(key.rfind("blocks.", 0), 0u) << key << ": an FP8 GEMM outside the transformer blocks";
    out.at(std::stoul(key.substr(7, key.find('.', 7) - 7))).push_back(key.substr(key.find('.', 7) + 1));
  }
  return out;
}

float value(const Tensor& t) { return raw::to(t, DType::f32).item<float>(); }

TEST(GptFp8, TheBlocksProjectionsAndNothingElseRunInFp8) {
  for (const auto& [name, attention, expected] : std::vector<std::tuple<std::string, AttentionType, size_t>>{
           {"mha", AttentionType::mha, 4}, {"gqa", AttentionType::gqa, 4}}) {
    GPTOptions o = fp8_gpt(attention);
    const GPT model(o);
    const auto sites = sites_per_block(model);
    ASSERT_EQ(sites.size(), 2u) << name;
    // attention's qkv (one GEMM over the concatenated weights) and output projection, the MLP's two.
    EXPECT_EQ(sites[0], (std::vector<std::string>{"fp8_0", "fp8_1", "fp8_2", "fp8_3"})) << name;
    EXPECT_EQ(sites[1].size(), expected) << name;
    for (const std::string& key : model.fp8_scaling()->keys()) {
      const Fp8Slot slot = model.fp8_scaling()->slot(key);
      for (int role = 0; role < 3; ++role) EXPECT_GT(value(slot.amax[role]), 0.0f) << name << " " << key << " " << role;
    }
  }
}

// fp8.bf16_first_blocks / _last_blocks: the blocks at either end keep their bf16 GEMMs; the others have
// the same FP8 call sites as before.
TEST(GptFp8, BlocksKeptInBf16HaveNoFp8Gemms) {
  GPTOptions o = fp8_gpt(AttentionType::gqa);
  o.num_layers = 5;
  o.fp8_scaling.bf16_first_blocks = 2;
  o.fp8_scaling.bf16_last_blocks = 1;
  const GPT model(o);
  const auto sites = sites_per_block(model);
  ASSERT_EQ(sites.size(), 5u);
  for (size_t b : {0u, 1u, 4u}) EXPECT_TRUE(sites[b].empty()) << "block " << b;
  for (size_t b : {2u, 3u}) EXPECT_EQ(sites[b], (std::vector<std::string>{"fp8_0", "fp8_1", "fp8_2", "fp8_3"})) << b;
}

// MLA's latent down-projection is 24 wide (kv_lora_rank 16 + rope 8) and SwiGLU's down projection reads 88
// features: not multiples of 16, so they keep their bf16 GEMMs while the other projections run in FP8.
TEST(GptFp8, ProjectionsThatDoNotFitStayBf16) {
  const GPT mla(fp8_gpt(AttentionType::mla));
  const auto mla_sites = sites_per_block(mla);
  GPTOptions o = fp8_gpt(AttentionType::gqa);
  o.mlp = nn::Activation::swiglu;
  const GPT llama(o);
  const auto llama_sites = sites_per_block(llama);
  // q_proj (32 -> 64), kv_b_proj (16 -> 64), o_proj and the MLP's two; kv_a_proj (32 -> 24) stays bf16.
  EXPECT_EQ(mla_sites[0].size(), 5u);
  // qkv, o and gate+up (2 x 88 = 176 wide); the down projection reads 88 features (SwiGLU's 8/3 x 32
  // rounded up to 8), not a multiple of 16, so it keeps its bf16 GEMM.
  EXPECT_EQ(llama_sites[0], (std::vector<std::string>{"fp8_0", "fp8_1", "fp8_2"}));
}

// An FP8 GEMM casts the f32 master weight itself, so the model's per-step bf16 copies (compute_copies.h)
// leave out the weights of the blocks' FP8 linears: no refresh converts a weight no GEMM reads.
TEST(GptFp8, TheBf16CopiesLeaveOutTheWeightsOfFp8Linears) {
  GPTOptions o = fp8_gpt(AttentionType::gqa);
  GPTOptions plain_o = o;
  plain_o.fp8_linears = false;
  const GPT fp8(o), bf16(plain_o);
  for (int step = 0; step < 3; ++step) {  // lookups mark the wanted copies, later forwards convert them
    fp8.forward(batch());
    bf16.forward(batch());
  }
  const int64_t fp8_conversions = fp8.compute_copies().conversions();
  const int64_t bf16_conversions = bf16.compute_copies().conversions();
  // q, k, v, o and the MLP's two weights of each of the 2 blocks, converted once (the weights do not change).
  EXPECT_EQ(bf16_conversions - fp8_conversions, 2 * 6) << fp8_conversions << " vs " << bf16_conversions;
  EXPECT_GT(fp8_conversions, 0) << "the embedding and head still have their bf16 copies";
}

// model.recompute: full runs each block's forward twice a step; with fp8.cache_weights (the default) the
// second run takes the FP8 weight copies of the first (framework/autograd/fp8_weight_cache.h): one cast a
// weight, and the loss and every gradient those of casting at every call, bit for bit.
TEST(GptFp8, ARecomputedBlockTakesTheForwardsFp8WeightsWithTheSameGradients) {
  for (Fp8Recipe recipe : {Fp8Recipe::current, Fp8Recipe::delayed}) {
    GPTOptions o = fp8_gpt(AttentionType::gqa);
    o.recompute = RecomputeMode::full;
    o.fp8_scaling.recipe = recipe;
    GPTOptions per_call = o;
    per_call.fp8_scaling.cache_weights = false;
    const GPT cached(o), plain(per_call);
    for (size_t i = 0; i < cached.parameters().size(); ++i) {
      raw::copy_(plain.parameters()[i], cached.parameters()[i]);  // the same weights
    }
    EXPECT_EQ(plain.fp8_weight_cache(), nullptr);
    ASSERT_NE(cached.fp8_weight_cache(), nullptr);
    const Tensor labels = from_vector<int64_t>(std::vector<int64_t>(16, 3), {16});
    const Tensor plain_loss = GPT::loss(plain.forward(batch()), labels, 16);
    backward(plain_loss);
    Fp8WeightCache& cache = *cached.fp8_weight_cache();
    Tensor cached_loss;
    {
      const Fp8WeightCache::StepScope step(&cache);
      cached_loss = GPT::loss(cached.forward(batch()), labels, 16);
      backward(cached_loss);
    }
    const std::string what = recipe == Fp8Recipe::current ? "current" : "delayed";
    EXPECT_EQ(value(cached_loss), value(plain_loss)) << what;
    const std::vector<Tensor> a = cached.parameters(), b = plain.parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(a[i].grad().defined() && b[i].grad().defined()) << what << " parameter " << i;
      EXPECT_TRUE(testing::all_close(a[i].grad(), b[i].grad(), 0, 0)) << what << " parameter " << i;
    }
    // Two blocks of four FP8 linears: each weight cast in the forward and taken by the recompute.
    EXPECT_EQ(cache.stored(), 8) << what;
    EXPECT_EQ(cache.reused(), 8) << what;
    EXPECT_EQ(cache.size(), 0) << what << ": the step's copies outlived it";
  }
}

}  // namespace
}  // namespace cpf::models
