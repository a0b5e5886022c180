#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "framework/autograd/ops.h"
#include "models/gpt.h"
#include "models/gpt_input.h"
#include "support/test_utils.h"

namespace cpf::models {
namespace {

using testing::all_close;

GPTOptions small(AttentionType attention = AttentionType::mha) {
  GPTOptions o;
  o.vocab_size = 11;
  o.hidden_size = 16;
  o.num_layers = 2;
  o.num_heads = 4;
  o.attention = attention;
  if (attention == AttentionType::gqa) o.num_kv_heads = 2;
  o.kv_lora_rank = 8;
  o.qk_nope_head_dim = 4;
  o.qk_rope_head_dim = 4;
  o.v_head_dim = 4;
  return o;
}

std::map<std::string, Tensor> params_of(const nn::Module& m) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : m.named_parameters()) out[name] = t;
  return out;
}

double std_of(const Tensor& t) {
  double sq = 0;
  for (double v : t.to_vector<double>()) sq += v * v;
  return std::sqrt(sq / static_cast<double>(t.numel()));
}

TEST(GPT, ParameterNamesFollowTheBlockLayout) {
  GPT model(small());
  auto p = params_of(model);
  for (const char* name : {"embed_tokens.weight", "blocks.0.attn_norm.weight", "blocks.0.attn.q_proj.weight",
                           "blocks.0.attn.o_proj.weight", "blocks.0.mlp_norm.weight", "blocks.0.mlp.fc_in.weight",
                           "blocks.1.mlp.fc_out.weight", "final_norm.weight"}) {
    EXPECT_TRUE(p.count(name)) << name;
  }
  EXPECT_FALSE(p.count("lm_head.weight"));  // tied
  GPTOptions untied = small();
  untied.tie_embeddings = false;
  untied.positions = PositionType::learned;
  untied.mlp = nn::Activation::swiglu;
  untied.norm = NormType::layernorm;
  untied.bias = true;
  auto q = params_of(GPT(untied));
  for (const char* name : {"lm_head.weight", "embed_positions.weight", "blocks.1.mlp.gate_proj.weight",
                           "blocks.1.mlp.down_proj.weight", "blocks.1.mlp.down_proj.bias", "final_norm.bias"}) {
    EXPECT_TRUE(q.count(name)) << name;
  }
}

TEST(GPT, InitScalesResidualProjections) {
  GPTOptions o = small();
  o.hidden_size = 64;
  o.num_layers = 8;
  o.num_heads = 4;
  Generator gen(5);
  GPT model(o, &gen);
  auto p = params_of(model);
  const double residual = 0.02 / std::sqrt(16.0);
  EXPECT_NEAR(std_of(p["embed_tokens.weight"]), 0.02, 0.003);
  EXPECT_NEAR(std_of(p["blocks.3.attn.q_proj.weight"]), 0.02, 0.002);
  EXPECT_NEAR(std_of(p["blocks.3.mlp.fc_in.weight"]), 0.02, 0.001);
  EXPECT_NEAR(std_of(p["blocks.3.attn.o_proj.weight"]), residual, residual * 0.1);
  EXPECT_NEAR(std_of(p["blocks.3.mlp.fc_out.weight"]), residual, residual * 0.1);
  EXPECT_EQ(p["blocks.3.mlp_norm.weight"].to_vector<double>(), std::vector<double>(64, 1.0));
  // The same seed gives the same model.
  Generator gen2(5);
  GPT again(o, &gen2);
  EXPECT_TRUE(all_close(params_of(again)["blocks.7.mlp.fc_out.weight"], p["blocks.7.mlp.fc_out.weight"], 0, 0));
}

// Packing documents next to each other must not change any document's logits: attention stays
// inside each sequence, and positions restart at 0.
void expect_documents_independent(const GPTOptions& o) {
  GPT model(o);
  const std::vector<int64_t> a{1, 2, 3, 4, 5}, b{7, 8, 9};
  const Tensor alone = model.forward(make_prompt_input({a}));
  const Tensor packed = model.forward(make_prompt_input({b, a}));
  ASSERT_EQ(packed.shape(), (Shape{8, o.vocab_size}));
  EXPECT_TRUE(all_close(narrow(packed, 0, 3, 5), alone, 1e-5, 1e-4));
}

TEST(GPT, AttentionNeverCrossesDocuments) {
  for (AttentionType t : {AttentionType::mha, AttentionType::gqa, AttentionType::mla})
    expect_documents_independent(small(t));
  GPTOptions learned = small();
  learned.positions = PositionType::learned;
  learned.tie_embeddings = false;
  expect_documents_independent(learned);
}

TEST(GPT, IsCausalInsideADocument) {
  GPT model(small(AttentionType::gqa));
  const Tensor full = model.forward(make_prompt_input({{1, 2, 3, 4, 5, 6}}));
  const Tensor prefix = model.forward(make_prompt_input({{1, 2, 3}}));
  EXPECT_TRUE(all_close(narrow(full, 0, 0, 3), prefix, 1e-5, 1e-4));
  EXPECT_FALSE(all_close(narrow(full, 0, 2, 1), narrow(full, 0, 3, 1), 1e-3, 0));
}

TEST(GPT, LossIsTheTokenSumOverTheNormalizer) {
  GPTOptions o = small();
  o.dtype = DType::f64;
  GPT model(o);
  const Tensor logits = model.forward(make_prompt_input({{1, 2, 3, 4}}));
  const Tensor labels = from_vector<int64_t>({2, -100, 4, 5}, {4});
  const auto lv = logits.to_vector<double>();
  double expected = 0;
  const int64_t targets[] = {2, -1, 4, 5};
  for (int64_t r = 0; r < 4; ++r) {
    if (targets[r] < 0) continue;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < o.vocab_size; ++c) m = std::max(m, lv[r * o.vocab_size + c]);
    for (int64_t c = 0; c < o.vocab_size; ++c) s += std::exp(lv[r * o.vocab_size + c] - m);
    expected += m + std::log(s) - lv[r * o.vocab_size + targets[r]];
  }
  EXPECT_NEAR(GPT::loss(logits, labels, 3).item<double>(), expected / 3, 1e-12);
  EXPECT_NEAR(GPT::loss(logits, labels, 10).item<double>(), expected / 10, 1e-12);
  EXPECT_EQ(GPT::loss(logits, full({4}, -100, {.dtype = DType::i64}), 1).item<double>(), 0.0);
}

TEST(GPT, BshdBatchesBecomeOneSequencePerRow) {
  models::data::LocalBatch local;
  local.layout = models::data::Layout::bshd;
  local.tokens = from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  local.labels = from_vector<int64_t>({2, 3, -100, 5, 6, -100}, {2, 3});
  local.positions = from_vector<int64_t>({0, 1, 2, 0, 1, 2}, {2, 3});
  local.num_valid_labels = local.global_num_valid_labels = 4;
  const GPTBatch b = make_gpt_batch(local);
  EXPECT_EQ(b.input.tokens.shape(), (Shape{6}));
  EXPECT_EQ(b.input.seq.cu_seqlens_q, (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{2, 3, -100, 5, 6, -100}));
  EXPECT_EQ(last_token_rows({{1, 2}, {3}, {4, 5, 6}}), (std::vector<int64_t>{1, 2, 5}));
}

TEST(GPT, RejectsInvalidOptionsNamingTheKey) {
  auto expect_problem = [](GPTOptions o, const std::string& key, const std::string& message) {
    auto p = check_options(o);
    ASSERT_TRUE(p.has_value()) << message;
    EXPECT_EQ(p->key, key);
    EXPECT_EQ(p->message, message);
    EXPECT_CPF_ERROR(GPT{o}, "GPT: " + message);
  };
  GPTOptions o = small(AttentionType::gqa);
  o.num_heads = 8;
  o.num_kv_heads = 3;
  expect_problem(o, "num_kv_heads", "num_kv_heads=3 must divide num_heads=8");
  o = small();
  o.num_kv_heads = 2;
  expect_problem(o, "num_kv_heads",
                 "num_kv_heads=2 needs attention: gqa (with attention: mha every head has its own "
                 "keys and values)");
  o = small();
  o.num_heads = 3;
  expect_problem(o, "num_heads", "num_heads=3 must divide hidden_size=16 (or set head_dim)");
  o = small();
  o.head_dim = 3;
  expect_problem(o, "head_dim", "head_dim=3 gives an odd head dim of 3; RoPE rotates pairs of dims");
  o = small(AttentionType::mla);
  o.qk_rope_head_dim = 3;
  expect_problem(o, "qk_rope_head_dim", "qk_rope_head_dim=3 must be even and at least 2");
  o = small();
  o.vocab_size = 0;
  expect_problem(o, "vocab_size", "vocab_size=0 must be positive");
  o = small();
  o.window = -2;
  expect_problem(o, "window", "window=-2 must be -1 (unbounded) or >= 0");
  o = small();
  o.rope_scaling = {.factor = 8, .low_freq_factor = 4, .high_freq_factor = 4};
  expect_problem(o, "rope_scaling.high_freq_factor", "rope_scaling.high_freq_factor=4 must be above low_freq_factor=4");
  o = small();
  o.positions = PositionType::learned;
  o.rope_scaling.factor = 32;
  expect_problem(o, "rope_scaling.factor",
                 "rope_scaling.factor=32 scales RoPE, but positions is learned (set positions: rope)");
  EXPECT_EQ(effective_intermediate_size(small()), 64);
  o = small();
  o.mlp = nn::Activation::swiglu;
  EXPECT_EQ(effective_intermediate_size(o), 48);  // 8/3 * 16 = 42.7 -> 48
}

TEST(GPT, RejectsMalformedInputs) {
  GPT model(small());
  GPTInput in = make_prompt_input({{1, 2, 3}});
  GPTInput bad = in;
  bad.tokens = to(in.tokens, DType::f32);
  EXPECT_CPF_ERROR(model.forward(bad), "GPT: tokens must be a 1-D i64 tensor");
  bad = in;
  bad.positions = from_vector<int64_t>({0, 1}, {2});
  EXPECT_CPF_ERROR(model.forward(bad), "GPT: positions must be i64 of the tokens' shape [3], got [2]");
  bad = in;
  bad.seq = SequenceInfo::from_lengths({4});
  EXPECT_CPF_ERROR(model.forward(bad), "GPT: the sequence info covers 4 storage tokens but the batch has 3 tokens");
  bad = in;
  bad.tokens = from_vector<int64_t>({1, 2, 11}, {3});
  EXPECT_CPF_ERROR(model.forward(bad), "11");
  const Tensor logits = model.forward(in);
  EXPECT_CPF_ERROR(GPT::loss(logits, from_vector<int64_t>({1, 2}, {2}), 1),
                   "GPT::loss: labels (T) must match logits (T, V): labels=[2] logits=[3,11]");
  EXPECT_CPF_ERROR(GPT::loss(logits, from_vector<int64_t>({1, 2, 3}, {3}), 0),
                   "GPT::loss: normalizer=0 must be at least 1");
  EXPECT_CPF_ERROR(make_prompt_input({{1}, {}}), "make_prompt_input: an empty prompt");
}

}  // namespace
}  // namespace cpf::models
