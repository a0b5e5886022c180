#pragma once
// Attention sinks: a learnable logit per query head that joins every softmax denominator (gpt-oss),
//
//   p_ij = exp(s_ij - m) / (exp(sink_h - m) + sum_j exp(s_ij - m))
//
// i.e. one more key with logit sink_h and a zero value. It only rescales a finished row:
//
//   lse' = log(exp(lse) + exp(sink_h)),   out' = exp(lse - lse') * out
//
// so every kernel (CPU, unfused CUDA, cuDNN) runs without it and the rescale follows, and a CP
// strategy applies it once to the merged global row (never per ring step or per all-gather chunk).
// The backward needs nothing new for dq/dk/dv: the kernels' backward given (out', lse') already uses
// the probabilities with the sink in their denominator and D = rowsum(dO * out') - dlse. The sink's
// own gradient is the usual softmax gradient of a key with a zero value:
//
//   d(sink_h) = -sum_rows exp(sink_h - lse') * (rowsum(dO * out') - dlse)
//
// A row that sees no key (padded storage, a fully masked row) keeps out = 0 and lse = -inf and adds
// nothing to d(sink): the sink joins rows that see at least one key.
//
// Layouts: out is (.., h, d_v) in `format`; lse is (batch, h, s) for bshd/sbhd and (h, t) for thd.
#include "attention/spec.h"
#include "framework/tensor/tensor.h"

namespace cpf {

// Throws unless `sink` is a 1-D (num_heads) tensor of f32 (or f64 with f64 inputs) on `device`. `op`
// prefixes the message.
void check_attention_sink(const Tensor& sink, int64_t num_heads, DType input_dtype, const Device& device,
                          const char* op);

namespace raw {

struct SinkRescaled {
  Tensor out;  // out's dtype
  Tensor lse;  // lse's dtype
};

// (out, lse) of attention without the sink -> the same rows with the sink in their denominator.
SinkRescaled apply_attention_sink(const Tensor& out, const Tensor& lse, const Tensor& sink, QkvFormat format);

// d(sink) (h), in sink's dtype, from the results WITH the sink (out', lse') and their gradients;
// dlse may be undefined (no gradient reached lse).
Tensor attention_sink_grad(const Tensor& dout, const Tensor& dlse, const Tensor& out, const Tensor& lse,
                           const Tensor& sink, QkvFormat format);

}  // namespace raw
}  // namespace cpf
