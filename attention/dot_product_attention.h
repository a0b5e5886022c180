#pragma once
// dot_product_attention: the one attention function every module and CP strategy calls.
//
//   auto [out, lse] = dot_product_attention(q, k, v, {.qkv_format = QkvFormat::thd, .mask = MaskType::causal},
//                                           SequenceInfo::from_cu_seqlens({0, 5, 12}, {0, 8, 16}));
//
// q (.., h_q, d_qk), k (.., h_kv, d_qk), v (.., h_kv, d_v) in spec.qkv_format; h_q % h_kv == 0
// (GQA/MQA share each kv head among h_q / h_kv query heads); d_v may differ from d_qk (MLA).
// out has q's layout with head dim d_v; lse = log sum_j exp(scale * q.k_j) over the visible keys,
// (batch, h_q, s_q) for bshd/sbhd and (h_q, t) for thd, f32 (f64 for f64 inputs). A query that sees
// no key (fully masked row, padded storage) gets out = 0, lse = -inf and exactly zero gradients.
//
// Differentiable in q, k and v (and spec.sink when set: attention_sink.h), through out and lse both (a
// CP merge differentiates through lse).
// The backward is the hand-written flash backward (attention_op.h), not a composition of ops.
#include <optional>

#include "attention/attention_op.h"
#include "attention/sequence_info.h"
#include "attention/spec.h"
#include "framework/tensor/tensor.h"

namespace cpf {

struct AttentionOutput {
  Tensor out;
  Tensor lse;
};

// seq: where the sequences are and their positions; optional for bshd/sbhd without a padding mask
// (each batch row is then one whole sequence), required for thd and padding masks.
AttentionOutput dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                      const std::optional<SequenceInfo>& seq = std::nullopt,
                                      const AttentionKernelConfig& config = {});

}  // namespace cpf
