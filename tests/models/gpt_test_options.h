#pragma once
// Small GPTs the model tests share (a copy per test file drifted apart silently): every attention
// type can be selected on them, and the MLA dims are set so `attention = mla` works as is.
#include <vector>

#include "models/data/data_loader.h"
#include "models/gpt.h"

namespace cpf::models {

// f32, 32 wide, 4 heads (GQA: 2 KV heads), vocabulary 11; init_std 0.1, larger than GPT-2's, so the
// logits are far from uniform and precision errors are visible. gpt_precision and gpt_compute_copies.
inline GPTOptions precision_gpt(AttentionType attention) {
  GPTOptions o;
  o.vocab_size = 11;
  o.hidden_size = 32;
  o.num_layers = 2;
  o.num_heads = 4;
  o.attention = attention;
  if (attention == AttentionType::gqa) o.num_kv_heads = 2;
  o.kv_lora_rank = 16;
  o.qk_nope_head_dim = 8;
  o.qk_rope_head_dim = 8;
  o.v_head_dim = 8;
  o.init_std = 0.1;
  return o;
}

// f64, 16 wide, 4 heads, vocabulary 13, MHA: exact comparisons of logits and losses between two ways
// of computing them (gpt_forward_loss, gpt_kv_cache).
inline GPTOptions f64_gpt() {
  GPTOptions o;
  o.vocab_size = 13;
  o.hidden_size = 16;
  o.num_layers = 2;
  o.num_heads = 4;
  o.kv_lora_rank = 8;
  o.qk_nope_head_dim = 4;
  o.qk_rope_head_dim = 4;
  o.v_head_dim = 4;
  o.dtype = DType::f64;
  return o;
}

// f64, 16 wide, 2 layers, 4 heads (GQA: 2 KV heads), vocabulary 14, the MLA dims set (d_qk 8, d_v 6) so
// `attention = mla` works as is: exact comparisons of two ways to run one model (gpt_cp, gpt_recompute,
// memory_model's parameter counts).
inline GPTOptions small_f64_gpt(AttentionType attention) {
  GPTOptions o;
  o.vocab_size = 14;
  o.hidden_size = 16;
  o.num_layers = 2;
  o.num_heads = 4;
  o.attention = attention;
  o.num_kv_heads = attention == AttentionType::gqa ? 2 : 0;
  o.kv_lora_rank = 8;
  o.qk_nope_head_dim = 4;
  o.qk_rope_head_dim = 4;
  o.v_head_dim = 6;
  o.dtype = DType::f64;
  return o;
}

// The first `n` packed THD batches of one- to three-digit addition: 64 storage tokens, documents of at most
// 16 tokens, slots padded to 8 (CP up to 4). What small_f64_gpt trains in gpt_cp and gpt_recompute.
inline std::vector<models::data::Batch> packed_addition_batches(int n) {
  models::data::DataOptions d;
  d.task = "addition";
  d.min_len = 1;
  d.max_len = 3;
  d.seq_len = 16;
  d.tokens_per_batch = 64;
  d.pad_multiple = 8;
  models::data::DataLoader loader(d);
  std::vector<models::data::Batch> out;
  for (int i = 0; i < n; ++i) out.push_back(loader.next());
  return out;
}

}  // namespace cpf::models
