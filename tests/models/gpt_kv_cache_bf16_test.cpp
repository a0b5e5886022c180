// KV-cache decoding in bf16 mixed precision on the CPU (bf16 emulated: every kernel rounds where the
// GPU's does, docs/training.md): fed the same tokens, the cached decoder's logits equal full-window
// decoding's to bf16 steps for MHA, GQA and MLA (MLA's cached path attends over the absorbed latent,
// its full path over per-head K/V, so the two round in different places), also while the window
// slides; MHA and GQA project q, k and v with one GEMM over a kept weight concatenation. The model and prompts are
// tests/tensor/cuda/gpt_kv_cache_test.cpp's, whose GPU bf16 checks compare against this emulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "models/gpt.h"
#include "models/gpt_decoder.h"

namespace cpf::models {
namespace {

GPTOptions bf16_options(AttentionType attention) {
  GPTOptions o;
  o.vocab_size = 32;
  o.hidden_size = 64;
  o.num_layers = 2;
  o.num_heads = 4;
  o.attention = attention;
  if (attention == AttentionType::gqa) o.num_kv_heads = 2;
  o.kv_lora_rank = 32;
  o.qk_nope_head_dim = 16;
  o.qk_rope_head_dim = 16;
  o.v_head_dim = 16;
  o.init_std = 0.1;
  o.compute_dtype = DType::bf16;
  return o;
}

// `steps` calls of `decoder`, sequence i growing by forced[i][len_i]; every call's logits (f64).
std::vector<std::vector<double>> forced_logits(GPTDecoder& decoder, std::vector<std::vector<int64_t>> seqs,
                                               const std::vector<std::vector<int64_t>>& forced, int64_t steps) {
  std::vector<std::vector<double>> logits;
  const std::vector<bool> active(seqs.size(), true);
  for (int64_t s = 0; s < steps; ++s) {
    const Tensor rows = decoder.next_logits(seqs, active);  // (3, V) bf16
    EXPECT_EQ(rows.dtype(), DType::bf16);
    logits.push_back(raw::to(rows, DType::f64).to_vector<double>());
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].push_back(forced[i][seqs[i].size()]);
  }
  return logits;
}

class KVCacheBf16 : public ::testing::TestWithParam<AttentionType> {};

TEST_P(KVCacheBf16, TeacherForcedCachedLogitsEqualFullWindowToBf16Steps) {
  const std::vector<std::vector<int64_t>> prompts{{1, 2, 3, 4, 5}, {6}, {7, 8, 9}};
  // Fixed continuations (prompt + 15 tokens each): context 12 < 20, so the first window slides.
  std::vector<std::vector<int64_t>> forced = prompts;
  for (size_t i = 0; i < forced.size(); ++i) {
    for (int64_t t = 0; t < 15; ++t) forced[i].push_back((7 * t + 5 * static_cast<int64_t>(i) + 3) % 32);
  }
  Generator gen(9);
  GPT model(bf16_options(GetParam()), &gen);
  model.eval();
  GPTDecoder cached(model, 3, {.context = 12, .max_length = 20, .kv_cache = true});
  GPTDecoder full(model, 3, {.context = 12, .max_length = 20, .kv_cache = false});
  const auto a = forced_logits(cached, prompts, forced, 15);
  const auto b = forced_logits(full, prompts, forced, 15);
  double worst = 0, largest = 0;
  for (size_t s = 0; s < a.size(); ++s) {
    for (size_t i = 0; i < a[s].size(); ++i) {
      worst = std::max(worst, std::abs(a[s][i] - b[s][i]));
      largest = std::max(largest, std::abs(b[s][i]));
    }
  }
  // |logits| < 4 here, where a bf16 step is at most 2^-6; 0.1 is 6 steps (MLA measured 0.025, MHA and
  // GQA run the same kernels in the same order on both paths: 0).
  std::printf("bf16 cached vs full window: max |diff| %.4f, max |logit| %.3f\n", worst, largest);
  ASSERT_LT(largest, 4.0);
  EXPECT_LT(worst, 0.1);
  if (GetParam() != AttentionType::mla) EXPECT_EQ(worst, 0.0);
  EXPECT_LT(cached.tokens_fed(), full.tokens_fed());
  // MHA and GQA decode q, k and v with one GEMM over the kept concatenation of their bf16 copies, made
  // once a layer (weights; no biases here) and reused by every later step (compute_copies.h).
  if (GetParam() != AttentionType::mla) {
    EXPECT_EQ(model.compute_copies().stackings(), model.options().num_layers);
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, KVCacheBf16,
                         ::testing::Values(AttentionType::mha, AttentionType::gqa, AttentionType::mla),
                         [](const auto& info) {
                           return info.param == AttentionType::mha   ? std::string("mha")
                                  : info.param == AttentionType::gqa ? std::string("gqa")
                                                                     : std::string("mla");
                         });

}  // namespace
}  // namespace cpf::models
