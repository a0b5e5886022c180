#pragma once
// The non-differentiable attention kernels (namespace cpf::raw, like framework/tensor/ops): forward
// returns out and the log-sum-exp, backward maps (dout, dlse) to (dq, dk, dv). The differentiable
// cpf::dot_product_attention (dot_product_attention.h) wraps them; CP strategies call them directly
// when they run their own per-tile backward with the global out and lse (docs/cp_design.md, "The
// backward replays the ring").
//
// CPU implementation (attention/cpu/): FlashAttention-2 style. The forward walks KV tiles with an
// online softmax, so memory beyond the inputs and outputs is O(tile) per thread, never O(s^2). The
// backward recomputes probabilities from lse and uses D = rowsum(dO * O) - dlse. Tiles the mask
// hides entirely are skipped and counted in TileStats. bf16 computes in f32; lse is f32 (f64 for
// f64 inputs).
#include <optional>

#include "attention/attention_problem.h"
#include "attention/sequence_info.h"
#include "attention/spec.h"
#include "framework/tensor/tensor.h"

namespace cpf {

// Tiles (q block x kv block x query head) visited by one kernel call.
struct TileStats {
  int64_t full = 0;     // computed without masking
  int64_t partial = 0;  // computed with an element-wise mask
  int64_t skipped = 0;  // entirely masked: never computed
  int64_t computed() const { return full + partial; }
};

namespace raw {

struct AttentionForward {
  Tensor out;  // q's format with head dim d_v, q's dtype; 0 at padded or fully masked rows
  Tensor lse;  // (batch, h_q, s_q) or (h_q, t) for thd; -inf at padded or fully masked rows
  TileStats tiles;
  // A device kernel that put spec.sink into every row itself (cuDNN's sink graph) sets this; otherwise
  // raw::attention_forward rescales the rows after the kernel (attention_sink.h).
  bool sink_applied = false;
};

struct AttentionGrads {
  Tensor dq, dk, dv;  // shapes and dtype of q, k, v; exactly 0 at padded storage and masked rows
  TileStats tiles;
  Tensor dsink{};  // (h_q) in the sink's dtype when spec.sink is set (attention_sink.h), else undefined
};

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                   const std::optional<SequenceInfo>& seq = std::nullopt,
                                   const AttentionKernelConfig& config = {});

// dout has out's shape; dlse has lse's shape or is undefined (no gradient reaches lse). out and lse
// are the forward results (or, for a CP tile, the merged global ones). With spec.sink set, the
// forward returns the rows with the sink in their denominator and the backward also returns dsink.
AttentionGrads attention_backward(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionSpec& spec,
                                  const std::optional<SequenceInfo>& seq = std::nullopt,
                                  const AttentionKernelConfig& config = {});

}  // namespace raw
}  // namespace cpf
