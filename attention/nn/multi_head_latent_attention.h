#pragma once
// MultiHeadLatentAttention (DeepSeek-V2 MLA). Keys and values come from a low-rank latent c_kv, and
// the positional part of every key is one decoupled RoPE key shared by all heads:
//
//   q:   x -> [q_a_proj -> q_a_layernorm (RMS) -> q_b_proj | q_proj]  -> (.., H, nope + rope) = [q_nope | q_pe]
//   kv:  x -> kv_a_proj_with_mqa -> [c_kv (kv_lora_rank) | k_pe (rope)]
//        c_kv -> kv_a_layernorm (RMS) -> kv_b_proj -> (.., H, nope + v_head_dim) = [k_nope | v]
//   q = [q_nope | rope(q_pe)],  k = [k_nope | rope(k_pe) broadcast to every head]
//   out = o_proj(attention(q, k, v))     with d_qk = nope + rope, d_v = v_head_dim
//
// Parameter names follow the DeepSeek-V2 checkpoints (q_a_proj, q_a_layernorm.weight, ...).
#include <memory>
#include <optional>

#include "attention/cp/context_parallel.h"
#include "attention/dot_product_attention.h"
#include "attention/nn/kv_cache.h"
#include "framework/core/generator.h"
#include "framework/distributed/process_group.h"
#include "framework/nn/linear.h"
#include "framework/nn/module.h"
#include "framework/tensor/rope_frequencies.h"

namespace cpf::nn {

struct MultiHeadLatentAttentionOptions {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;  // 0 = a direct q projection (DeepSeek-V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  QkvFormat qkv_format = QkvFormat::bshd;
  MaskType mask = MaskType::causal;
  AttentionWindow window;
  std::optional<double> softmax_scale;  // default 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)
  double rope_base = 10000.0;
  RopeScaling rope_scaling{};  // Llama 3's frequency scaling; factor 1 = none (rope_frequencies.h)
  double norm_eps = 1e-6;
  bool bias = false;
  double init_std = 0.0;
  DType dtype = DType::f32;
  // A learnable logit per query head in every softmax denominator (attention_sink.h): parameter
  // "sinks" (num_heads), f32 (f64 for f64 modules), zero at init (model.attention_sink).
  bool attention_sink = false;
  AttentionKernelConfig kernel_config;  // kernel choice (backend, deterministic) of the attention call without CP
};

class MultiHeadLatentAttention : public nn::Module {
 public:
  explicit MultiHeadLatentAttention(const MultiHeadLatentAttentionOptions& options, Generator* gen = nullptr);

  // cp: context parallelism for this call: x is this rank's dual-chunk shard (cp/sharding.h) and seq
  // describes the GLOBAL batch; RoPE uses the shard's global positions and attention runs through
  // cp::context_parallel_attention. Null (or a group of size 1) runs single-rank attention.
  Tensor forward(const Tensor& x, const std::optional<SequenceInfo>& seq = std::nullopt,
                 const cp::ContextParallel* cp = nullptr) const;

  // Incremental decoding (qkv_format thd, a causal mask, under NoGradGuard): x (T_new, C) holds the
  // step's new tokens packed per sequence; each new token attends to its sequence's cached tokens and
  // itself (kv_cache.h). Gives the rows forward() gives for the same tokens over each whole prefix.
  // The cache holds the latent, not per-head keys/values: keys (S * capacity, 1, kv_lora_rank +
  // qk_rope_head_dim), values (S * capacity, 1, kv_lora_rank), one more column each with bias
  // (multi_head_latent_attention_cached.cpp).
  Tensor forward_cached(const Tensor& x, const KVCacheStep& step, KVCache& cache) const;

  const MultiHeadLatentAttentionOptions& options() const { return options_; }
  const AttentionSpec& spec() const { return spec_; }

 private:
  Tensor project_q(const Tensor& x) const;
  // q (.., H, nope + rope), k (.., H, nope + rope) and v (.., H, v_head_dim), RoPE applied at the positions.
  struct QKV {
    Tensor q, k, v;
  };
  QKV project_qkv(const Tensor& x, const Tensor& q_positions, const Tensor& kv_positions) const;
  // Its pieces: q with RoPE (.., H, nope + rope); the latent: normalised c_kv (.., kv_lora_rank) and the
  // rotated RoPE key (.., 1, rope).
  Tensor rotated_q(const Tensor& x, const Tensor& q_positions) const;
  std::pair<Tensor, Tensor> latent_parts(const Tensor& x, const Tensor& kv_positions) const;
  // Attention under CP moving the latent instead of K/V (cp::context_parallel_mla_attention).
  AttentionOutput latent_cp_attention(const Tensor& x, const Tensor& q_positions, const Tensor& kv_positions,
                                      const std::optional<SequenceInfo>& seq, const cp::ContextParallel& cp) const;
  cp::MlaLatentShape latent_shape() const;

  MultiHeadLatentAttentionOptions options_;
  AttentionSpec spec_;
  std::shared_ptr<nn::Linear> q_proj_, q_a_proj_, q_b_proj_, kv_a_proj_, kv_b_proj_, o_proj_;
  Tensor q_a_norm_weight_, kv_a_norm_weight_;
};

}  // namespace cpf::nn

namespace cpf {
// The old names, kept for one release.
using MultiHeadLatentAttention [[deprecated("use cpf::nn::MultiHeadLatentAttention (moved to cpf::nn)")]] =
    nn::MultiHeadLatentAttention;
using MultiHeadLatentAttentionOptions
    [[deprecated("use cpf::nn::MultiHeadLatentAttentionOptions (moved to cpf::nn)")]] =
        nn::MultiHeadLatentAttentionOptions;
}  // namespace cpf
