#pragma once
// MultiHeadAttention: q/k/v/o projections, rotary embedding and dot_product_attention. num_kv_heads
// picks MHA (= num_heads), GQA (a divisor) or MQA (1): the k/v projections produce num_kv_heads
// heads and each serves num_heads / num_kv_heads query heads.
//
//   x (B, T, C) -> q (B, T, H, D), k/v (B, T, H_kv, D) -> rope(q, k) -> attention -> (B, T, H*D) -> o_proj -> (B, T, C)
//
// The input layout follows qkv_format (attention_layout.h); with thd or a padding mask, forward
// needs the SequenceInfo, whose positions also drive RoPE.
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

struct MultiHeadAttentionOptions {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // 0 = num_heads (MHA); 1 = MQA
  int64_t head_dim = 0;      // 0 = hidden_size / num_heads
  QkvFormat qkv_format = QkvFormat::bshd;
  MaskType mask = MaskType::causal;
  AttentionWindow window;
  std::optional<double> softmax_scale;
  bool rope = true;
  double rope_base = 10000.0;
  RopeScaling rope_scaling{};  // Llama 3's frequency scaling; factor 1 = none (rope_frequencies.h)
  int64_t rotary_dim = -1;     // -1 = head_dim
  bool bias = false;
  double init_std = 0.0;  // forwarded to the projections (0 = uniform +-1/sqrt(in))
  DType dtype = DType::f32;
  // A learnable logit per query head in every softmax denominator (attention_sink.h): parameter
  // "sinks" (num_heads), f32 (f64 for f64 modules), zero at init (model.attention_sink).
  bool attention_sink = false;
  AttentionKernelConfig kernel_config;  // kernel choice (backend, deterministic) of the attention call without CP
};

class MultiHeadAttention : public nn::Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator* gen = nullptr);

  // cp: context parallelism for this call: x is this rank's dual-chunk shard (cp/sharding.h) and seq
  // describes the GLOBAL batch; RoPE uses the shard's global positions and attention runs through
  // cp::context_parallel_attention. Null (or a group of size 1) runs single-rank attention.
  Tensor forward(const Tensor& x, const std::optional<SequenceInfo>& seq = std::nullopt,
                 const cp::ContextParallel* cp = nullptr) const;

  // Incremental decoding (qkv_format thd, a causal mask, under NoGradGuard): x (T_new, C) holds the
  // step's new tokens packed per sequence; their keys and values (after RoPE) join `cache` and each new
  // token attends to its sequence's cached tokens and itself (kv_cache.h). Gives the rows forward()
  // gives for the same tokens over each whole prefix.
  Tensor forward_cached(const Tensor& x, const KVCacheStep& step, KVCache& cache) const;

  const MultiHeadAttentionOptions& options() const { return options_; }
  // The spec every forward call uses (heads and dims resolved).
  const AttentionSpec& spec() const { return spec_; }

 private:
  MultiHeadAttentionOptions options_;
  AttentionSpec spec_;
  std::shared_ptr<nn::Linear> q_proj_, k_proj_, v_proj_, o_proj_;
};

}  // namespace cpf::nn

namespace cpf {
// The old names, kept for one release.
using MultiHeadAttention [[deprecated("use cpf::nn::MultiHeadAttention (moved to cpf::nn)")]] = nn::MultiHeadAttention;
using MultiHeadAttentionOptions [[deprecated("use cpf::nn::MultiHeadAttentionOptions (moved to cpf::nn)")]] =
    nn::MultiHeadAttentionOptions;
}  // namespace cpf
