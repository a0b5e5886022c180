// Incremental decoding with a KV cache (attention/nn/kv_cache.h, GPT::forward_cached,
// models/gpt_decoder.h) gives the logits of full-window decoding: for MHA, GQA, MLA, RoPE and learned
// positions, sliding windows, batches of unequal prompts, sequences that finish early and windows that
// slide past the context. f64 models so the comparison is tight; the checks on bad steps and calls name
// their values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention/nn/multi_head_attention.h"
#include "attention/nn/multi_head_latent_attention.h"
#include "framework/autograd/ops.h"
#include "framework/core/error.h"
#include "models/gpt.h"
#include "models/gpt_decoder.h"
#include "models/gpt_input.h"
#include "models/gpt_test_options.h"
#include "support/test_utils.h"

namespace cpf::models {
namespace {

struct Case {
  std::string name;
  GPTOptions options;
};

GPTOptions base() {
  GPTOptions o = f64_gpt();
  o.init_std = 0.3;  // large weights: logits that differ clearly between tokens and positions
  return o;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"mha_rope", base()});
  GPTOptions gqa = base();
  gqa.attention = AttentionType::gqa;
  gqa.num_kv_heads = 2;
  out.push_back({"gqa_rope", gqa});
  GPTOptions mqa = gqa;
  mqa.num_kv_heads = 1;
  mqa.mlp = nn::Activation::swiglu;
  out.push_back({"mqa_swiglu", mqa});
  GPTOptions mla = base();
  mla.attention = AttentionType::mla;
  out.push_back({"mla", mla});
  GPTOptions mla_q = mla;
  mla_q.q_lora_rank = 8;
  out.push_back({"mla_q_lora", mla_q});
  GPTOptions learned = base();
  learned.positions = PositionType::learned;
  learned.max_positions = 16;
  learned.norm = NormType::layernorm;
  learned.bias = true;
  learned.tie_embeddings = false;
  out.push_back({"mha_learned_layernorm", learned});
  GPTOptions window = base();
  window.window = 3;
  out.push_back({"mha_sliding_window", window});
  GPTOptions sink = gqa;
  sink.attention_sink = true;
  out.push_back({"gqa_attention_sink", sink});
  GPTOptions mla_sink = mla;
  mla_sink.attention_sink = true;
  out.push_back({"mla_attention_sink", mla_sink});
  // Biases ride on an extra latent column, exact also with sinks (sum of probabilities < 1).
  GPTOptions mla_bias = mla_sink;
  mla_bias.bias = true;
  mla_bias.norm = NormType::layernorm;
  out.push_back({"mla_bias_sink", mla_bias});
  GPTOptions mla_rope_only = mla_q;
  mla_rope_only.qk_nope_head_dim = 0;
  mla_rope_only.window = 2;
  out.push_back({"mla_rope_only_window", mla_rope_only});
  return out;
}

// Greedy decoding of `prompts` for `steps` tokens with both decoders side by side; sequence n stops
// after stop_after[n] tokens. Every step's logits must agree; returns the decoded sequences.
std::vector<std::vector<int64_t>> decode_both(const GPT& model, std::vector<std::vector<int64_t>> seqs, int64_t context,
                                              int64_t steps, const std::vector<int64_t>& stop_after) {
  int64_t max_len = 0;
  for (const auto& s : seqs) max_len = std::max<int64_t>(max_len, static_cast<int64_t>(s.size()) + steps);
  const int64_t n = static_cast<int64_t>(seqs.size());
  GPTDecoder cached(model, n, {.context = context, .max_length = max_len, .kv_cache = true});
  GPTDecoder full(model, n, {.context = context, .max_length = max_len, .kv_cache = false});
  std::vector<int64_t> produced(seqs.size(), 0);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<bool> active(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) active[i] = produced[i] < stop_after[i];
    if (std::find(active.begin(), active.end(), true) == active.end()) break;
    const Tensor a = cached.next_logits(seqs, active);
    const Tensor b = full.next_logits(seqs, active);
    EXPECT_EQ(a.shape(), b.shape());
    const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
    for (size_t i = 0; i < av.size(); ++i) {
      EXPECT_NEAR(av[i], bv[i], 1e-10) << "step " << step << " element " << i;
    }
    const int64_t vocab = a.size(1);
    size_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (!active[i]) continue;
      const auto begin = av.begin() + static_cast<std::ptrdiff_t>(row * vocab);
      seqs[i].push_back(std::max_element(begin, begin + vocab) - begin);
      ++produced[i];
      ++row;
    }
  }
  EXPECT_LT(cached.tokens_fed(), full.tokens_fed());  // the point of the cache
  return seqs;
}

class KVCacheEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(KVCacheEquivalence, BatchedGreedyDecodingMatchesFullWindow) {
  Generator gen(3);
  GPT model(GetParam().options, &gen);
  model.eval();
  // Unequal prompts; the second stops early (then sits out), the third decodes the longest.
  const auto out = decode_both(model, {{1, 2, 3}, {4}, {5, 6, 7, 8, 9}}, /*context=*/16, /*steps=*/8, {8, 3, 8});
  EXPECT_EQ(out[0].size(), 11u);
  EXPECT_EQ(out[1].size(), 4u);
  EXPECT_EQ(out[2].size(), 13u);
}

TEST_P(KVCacheEquivalence, WindowSlidingPastTheContextMatchesFullWindow) {
  Generator gen(4);
  GPT model(GetParam().options, &gen);
  model.eval();
  // Context 6: the first sequence outgrows it after 2 tokens, the prompt of the second already did.
  decode_both(model, {{1, 2, 3, 4}, {3, 1, 4, 1, 5, 9, 2, 6}}, /*context=*/6, /*steps=*/7, {7, 7});
}

// Decoding steps through the device tables (GPTDecoderOptions::cuda_graph, eager on the CPU: index_copy_
// into the caches, decode_attention) give the host tables' logits, also when a sequence sits steps out
// (its placeholder row lies past its length) and comes back.
TEST_P(KVCacheEquivalence, DecodingStepsThroughDeviceTablesMatchTheHostTables) {
  Generator gen(5);
  GPT model(GetParam().options, &gen);
  model.eval();
  std::vector<std::vector<int64_t>> seqs{{1, 2, 3}, {4}, {5, 6, 7, 8, 9}};
  GPTDecoder tables(model, 3, {.context = 16, .max_length = 16, .kv_cache = true, .cuda_graph = true});
  GPTDecoder host(model, 3, {.context = 16, .max_length = 16, .kv_cache = true, .cuda_graph = false});
  EXPECT_THAT(tables.graph_note(), ::testing::HasSubstr("does not capture graphs; decoding steps run eagerly"));
  EXPECT_EQ(host.graph_note(), "off (cuda_graph = false)");
  for (int64_t step = 0; step < 7; ++step) {
    const std::vector<bool> active{true, step != 2 && step != 3, step != 5};
    const Tensor a = tables.next_logits(seqs, active);
    const Tensor b = host.next_logits(seqs, active);
    ASSERT_EQ(a.shape(), b.shape());
    const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
    for (size_t i = 0; i < av.size(); ++i) ASSERT_NEAR(av[i], bv[i], 1e-10) << "step " << step << " element " << i;
    size_t row = 0;
    for (size_t n = 0; n < seqs.size(); ++n) {
      if (!active[n]) continue;
      const auto begin = av.begin() + static_cast<std::ptrdiff_t>(row++ * a.size(1));
      seqs[n].push_back(std::max_element(begin, begin + a.size(1)) - begin);
    }
  }
  EXPECT_EQ(tables.tokens_fed(), host.tokens_fed());
  EXPECT_EQ(tables.graph_replays(), 0);  // no graphs on the CPU
}

// The widest head a decoding step attends with: what decides whether the device kernel can serve it.
TEST(KVCache, DecodeHeadDimIsTheWidestCachedHead) {
  GPTOptions mha = base();
  EXPECT_EQ(decode_head_dim(mha), mha.hidden_size / mha.num_heads);
  mha.head_dim = 96;
  EXPECT_EQ(decode_head_dim(mha), 96);
  GPTOptions mla = base();
  mla.attention = AttentionType::mla;
  mla.kv_lora_rank = 512;
  mla.qk_rope_head_dim = 64;
  EXPECT_EQ(decode_head_dim(mla), 576);
  mla.bias = true;
  EXPECT_EQ(decode_head_dim(mla), 577);
  Generator gen(7);
  GPTOptions wide = base();
  wide.hidden_size = 8;
  wide.num_heads = 1;  // head dim 8 on the CPU: any width runs through the tables there
  GPT model(wide, &gen);
  EXPECT_THAT(GPTDecoder(model, 1, {.context = 4, .max_length = 4}).graph_note(),
              ::testing::HasSubstr("does not capture graphs"));
}

// next_greedy picks on the device what argmax over next_logits' rows picks, with the same bookkeeping.
TEST_P(KVCacheEquivalence, GreedyPicksEqualTheArgmaxOfTheLogits) {
  Generator gen(6);
  GPT model(GetParam().options, &gen);
  model.eval();
  std::vector<std::vector<int64_t>> a{{1, 2, 3}, {4}}, b = a;
  GPTDecoder picker(model, 2, {.context = 6, .max_length = 16});  // context 6: the first window slides
  GPTDecoder logits(model, 2, {.context = 6, .max_length = 16, .kv_cache = false});
  for (int64_t step = 0; step < 8; ++step) {
    const std::vector<bool> active{true, step != 3};
    const GPTDecoder::GreedyPicks picks = picker.next_greedy(a, active);
    const Tensor rows = logits.next_logits(b, active);
    const std::vector<double> v = rows.to_vector<double>();
    size_t r = 0;
    for (size_t n = 0; n < 2; ++n) {
      if (!active[n]) continue;
      const auto begin = v.begin() + static_cast<std::ptrdiff_t>(r * rows.size(1));
      const int64_t want = std::max_element(begin, begin + rows.size(1)) - begin;
      ASSERT_EQ(picks.tokens[r], want) << "step " << step << " sequence " << n;
      EXPECT_TRUE(picks.finite[r]);
      a[n].push_back(want);
      b[n].push_back(want);
      ++r;
    }
    EXPECT_EQ(r, picks.tokens.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KVCacheEquivalence, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(KVCache, PrefillLogitsEqualTheFullForwardOfEveryPromptToken) {
  Generator gen(5);
  GPT model(base(), &gen);
  model.eval();
  NoGradGuard no_grad;
  const std::vector<std::vector<int64_t>> prompts{{1, 2, 3, 4}, {7, 8}};
  const Tensor full = model.forward(make_prompt_input(prompts));  // (6, V)
  std::vector<nn::KVCache> caches(2);
  const nn::KVCacheStep step{.capacity = 5, .past = {0, 0}, .new_tokens = {4, 2}};
  const Tensor cached = model.forward_cached(from_vector<int64_t>({1, 2, 3, 4, 7, 8}, {6}), step, caches);
  const std::vector<double> a = cached.to_vector<double>(), b = full.to_vector<double>();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-10) << i;
  // Each layer's cache holds both slots: (2 sequences x capacity 5, heads, head dim).
  EXPECT_EQ(caches[0].keys().shape(), (Shape{10, 4, 4}));
}

TEST(KVCache, MlaCachesTheLatentNotPerHeadKeys) {
  GPTOptions o = base();
  o.attention = AttentionType::mla;
  Generator gen(6);
  GPT model(o, &gen);
  model.eval();
  NoGradGuard no_grad;
  std::vector<nn::KVCache> caches(2);
  const nn::KVCacheStep step{.capacity = 4, .past = {0}, .new_tokens = {3}};
  const Tensor cached = model.forward_cached(from_vector<int64_t>({1, 2, 3}, {3}), step, caches);
  const Tensor full = model.forward(make_prompt_input({{1, 2, 3}}));
  EXPECT_TRUE(testing::all_close(cached, full, 1e-10, 1e-10));
  // keys [c_kv | k_pe]: kv_lora_rank 8 + rope 4 in one shared head; values c_kv.
  EXPECT_EQ(caches[0].keys().shape(), (Shape{4, 1, 12}));
  EXPECT_EQ(caches[0].values().shape(), (Shape{4, 1, 8}));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

TEST(KVCache, StepChecksNameTheirValues) {
  using ::testing::HasSubstr;
  EXPECT_THAT(error_of([] {
                nn::KVCacheStep{.capacity = 4, .past = {1}, .new_tokens = {1, 2}}.check();
              }),
              HasSubstr("past and new_tokens need one entry per sequence"));
  EXPECT_THAT(error_of([] { nn::KVCacheStep{.capacity = 4, .past = {3}, .new_tokens = {2}}.check(); }),
              HasSubstr("sequence 0 would hold 3 + 2 tokens but its slot holds capacity=4"));
  EXPECT_THAT(error_of([] { nn::KVCacheStep{.capacity = 4, .past = {-1}, .new_tokens = {2}}.check(); }),
              HasSubstr("past=-1 new_tokens=2; both must be >= 0"));
  EXPECT_THAT(error_of([] {
                nn::KVCacheStep{.capacity = 4, .past = {1, 2}, .new_tokens = {0, 0}}.check();
              }),
              HasSubstr("no sequence has new tokens"));
  EXPECT_THAT(error_of([] { nn::KVCacheStep{.capacity = 0, .past = {0}, .new_tokens = {1}}.check(); }),
              HasSubstr("capacity=0 must be at least 1"));
}

TEST(KVCache, AppendRejectsACallThatDoesNotFitTheCache) {
  NoGradGuard no_grad;
  nn::KVCache cache;
  const nn::KVCacheStep step{.capacity = 4, .past = {0}, .new_tokens = {2}};
  cache.append(zeros({2, 2, 3}, {.dtype = DType::f64}), zeros({2, 2, 3}, {.dtype = DType::f64}), step);
  EXPECT_THAT(
      error_of([&] {
        cache.append(zeros({1, 2, 3}, {.dtype = DType::f64}), zeros({1, 2, 3}, {.dtype = DType::f64}),
                     nn::KVCacheStep{.capacity = 8, .past = {2}, .new_tokens = {1}});
      }),
      ::testing::HasSubstr("allocated for 1 sequences of capacity 4, but the step has 1 sequences of capacity 8"));
  EXPECT_THAT(error_of([&] {
                cache.append(zeros({1, 2, 3}), zeros({1, 2, 3}),
                             nn::KVCacheStep{.capacity = 4, .past = {2}, .new_tokens = {1}});
              }),
              ::testing::HasSubstr("the cache holds keys [4,2,3] f64 on cpu and values [4,2,3]; got k=[1,2,3] f32"));
  EXPECT_THAT(error_of([&] {
                cache.append(zeros({3, 2, 3}, {.dtype = DType::f64}), zeros({3, 2, 3}, {.dtype = DType::f64}),
                             nn::KVCacheStep{.capacity = 4, .past = {2}, .new_tokens = {1}});
              }),
              ::testing::HasSubstr("for the step's 1 new tokens, got k=[3,2,3]"));
}

TEST(KVCache, ModelAndDecoderRejectMisuse) {
  Generator gen(6);
  GPT model(base(), &gen);
  std::vector<nn::KVCache> caches(2);
  const nn::KVCacheStep step{.capacity = 4, .past = {0}, .new_tokens = {2}};
  const Tensor tokens = from_vector<int64_t>({1, 2}, {2});
  // With autograd on, the cache (copies outside the graph) would silently cut gradients.
  EXPECT_THAT(error_of([&] { model.forward_cached(tokens, step, caches); }),
              ::testing::HasSubstr("cached decoding runs without autograd"));
  NoGradGuard no_grad;
  std::vector<nn::KVCache> one(1);
  EXPECT_THAT(error_of([&] { model.forward_cached(tokens, step, one); }),
              ::testing::HasSubstr("need one KVCache per block (2), got 1"));
  EXPECT_THAT(error_of([&] {
                model.forward_cached(from_vector<int64_t>({1, 2, 3}, {3}), step, caches);
              }),
              ::testing::HasSubstr("with the step's 2 new tokens, got [3]"));
  GPTDecoder decoder(model, 2, {.context = 8, .max_length = 8});
  EXPECT_THAT(error_of([&] {
                decoder.next_logits({{1}, {2}}, {false, false});
              }),
              ::testing::HasSubstr("no sequence is active"));
  EXPECT_THAT(error_of([&] { decoder.next_logits({{1}}, {true}); }),
              ::testing::HasSubstr("built for 2 sequences, got 1 sequences"));
  EXPECT_THAT(error_of([&] {
                decoder.next_logits({{1, 2, 3, 4, 5, 6, 7, 8, 9}, {2}}, {true, true});
              }),
              ::testing::HasSubstr("active sequence 0 has 9 tokens; expected 1 to max_length=8"));
  decoder.next_logits({{1, 2}, {2}}, {true, true});
  EXPECT_THAT(error_of([&] {
                decoder.next_logits({{1}, {2, 3}}, {true, true});
              }),
              ::testing::HasSubstr("sequence 0 shrank from 2 to 1 tokens"));
  EXPECT_THAT(error_of([] { GPTDecoder(GPT(base()), 0, {.context = 8, .max_length = 8}); }),
              ::testing::HasSubstr("num_sequences=0 must be at least 1"));
}

TEST(KVCache, ModulesNeedThdAndACausalMask) {
  NoGradGuard no_grad;
  nn::KVCache cache;
  const nn::KVCacheStep step{.capacity = 4, .past = {0}, .new_tokens = {2}};
  nn::MultiHeadAttention bshd({.hidden_size = 8, .num_heads = 2, .qkv_format = QkvFormat::bshd});
  EXPECT_THAT(error_of([&] {
                bshd.forward_cached(zeros({2, 8}), step, cache);
              }),
              ::testing::HasSubstr("MultiHeadAttention: cached decoding needs qkv_format thd"));
  nn::MultiHeadLatentAttention no_mask({.hidden_size = 8,
                                        .num_heads = 2,
                                        .kv_lora_rank = 4,
                                        .qk_nope_head_dim = 2,
                                        .qk_rope_head_dim = 2,
                                        .v_head_dim = 2,
                                        .qkv_format = QkvFormat::thd,
                                        .mask = MaskType::padding});
  EXPECT_THAT(error_of([&] {
                no_mask.forward_cached(zeros({2, 8}), step, cache);
              }),
              ::testing::HasSubstr("MultiHeadLatentAttention: cached decoding needs a causal mask"));
}

}  // namespace
}  // namespace cpf::models
