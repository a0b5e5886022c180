#pragma once
// What the attention modules share: the hidden-state layout of each qkv_format, splitting the
// projected hidden dim into heads and back, and rotary embedding at the positions the attention
// mask uses (SequenceInfo), so RoPE and the mask always agree, also under CP position offsets.
//
//   bshd: x (B, T, C) -> (B, T, H, D)     sbhd: x (T, B, C) -> (T, B, H, D)     thd: x (T, C) -> (T, H, D)
#include <memory>
#include <optional>
#include <string>

#include "attention/sequence_info.h"
#include "attention/spec.h"
#include "framework/distributed/process_group.h"
#include "framework/tensor/rope_frequencies.h"
#include "framework/tensor/tensor.h"

namespace cpf::nn {

// Checks x's rank for `format` and that its last dim is `hidden_size`; `op` names the module.
void check_hidden(const Tensor& x, QkvFormat format, int64_t hidden_size, const char* op);

// (..., heads * dim) -> (..., heads, dim) and back.
Tensor split_heads(const Tensor& x, int64_t heads, int64_t dim);
Tensor merge_heads(const Tensor& x);

// i64 positions for cpf::rope: (B, T) for bshd/sbhd, (T) for thd; from seq's q or kv positions, or
// 0..T-1 in every row without a SequenceInfo.
Tensor rope_positions(const Tensor& x_heads, QkvFormat format, const std::optional<SequenceInfo>& seq, bool kv);

// Under context parallelism x_heads is this rank's dual-chunk shard (cp/sharding.h) and `seq`
// describes the GLOBAL batch (what context_parallel_attention takes): the positions of the rank's
// tokens inside their sequences, shaped as rope_positions' result for the local tensor.
Tensor cp_rope_positions(const Tensor& x_heads, QkvFormat format, const std::optional<SequenceInfo>& seq, bool kv,
                         int64_t cp_size, int64_t cp_rank);

// The attention sink parameter of a module (attention_sink.h): (heads) zeros, f32 (f64 for f64 modules),
// the dtypes the kernels take with any input dtype.
Tensor sink_parameter(int64_t heads, DType module_dtype);

// The sink a module hands CP attention on a group of `cp_size` ranks: the same values, with 1/cp_size of
// the gradient. CP attention returns the whole group's d(sink) on every rank (context_parallel.h), and a
// trainer sums each parameter's gradient over the world, CP ranks included: scaled, the sink counts once.
Tensor cp_sink(const Tensor& sink, int64_t cp_size);
// `spec` with its sink (if any) as cp_sink gives it.
AttentionSpec with_cp_sink(AttentionSpec spec, int64_t cp_size);

// Rotates the first rotary_dim dims of every head of x (format, heads, dim) at `positions`.
Tensor apply_rope(const Tensor& x_heads, QkvFormat format, const Tensor& positions, const RopeFrequencies& frequencies,
                  int64_t rotary_dim);

}  // namespace cpf::nn

// The helpers' namespace before the folder was renamed (attention/modules, cpf::attention_modules):
// an alias kept for one release (deprecated in 0.1, removed in 0.2).
namespace cpf {
namespace attention_modules = nn;
}  // namespace cpf
