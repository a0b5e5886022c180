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
#include "framework/core/generator.h"
#include "framework/distributed/process_group.h"
#include "framework/nn/linear.h"
#include "framework/nn/module.h"

namespace cpf {

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
  int64_t rotary_dim = -1;  // -1 = head_dim
  bool bias = false;
  double init_std = 0.0;  // forwarded to the projections (0 = uniform +-1/sqrt(in))
  DType dtype = DType::f32;
  FlashConfig flash;  // kernel choice (backend, deterministic) of the attention call without CP
};

class MultiHeadAttention : public nn::Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator* gen = nullptr);

  // cp: context parallelism for this call: x is this rank's dual-chunk shard (cp/sharding.h) and seq
  // describes the GLOBAL batch; RoPE uses the shard's global positions and attention runs through
  // cp::context_parallel_attention. Null (or a group of size 1) runs single-rank attention.
  Tensor forward(const Tensor& x, const std::optional<SequenceInfo>& seq = std::nullopt,
                 const cp::ContextParallel* cp = nullptr) const;

  const MultiHeadAttentionOptions& options() const { return options_; }
  // The spec every forward call uses (heads and dims resolved).
  const AttentionSpec& spec() const { return spec_; }

 private:
  MultiHeadAttentionOptions options_;
  AttentionSpec spec_;
  std::shared_ptr<nn::Linear> q_proj_, k_proj_, v_proj_, o_proj_;
};

}  // namespace cpf
