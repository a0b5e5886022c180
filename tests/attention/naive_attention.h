#pragma once
// The oracle for dot_product_attention: naive O(s^2) attention composed of autograd primitives
// (matmul, where, logsumexp, exp), so its gradients come from the generic engine, independent of the
// flash kernels. The mask is a bool tensor built with plain loops from the sequence info's public
// arrays and the position rule of attention/mask.h.
#include <cmath>
#include <limits>
#include <optional>

#include "attention/sequence_info.h"
#include "attention/spec.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"

namespace cpf::testing {

struct NaiveAttention {
  Tensor out;
  Tensor lse;
};

// (rows, 1, s_q, s_kv) bool: true where query i of a row sees key j. thd is one row of t tokens.
inline Tensor naive_mask(const AttentionSpec& spec, const SequenceInfo& info, int64_t rows, int64_t s_q, int64_t s_kv) {
  const int64_t left = spec.window.left;
  const int64_t right =
      (spec.mask == MaskType::causal || spec.mask == MaskType::padding_causal) ? 0 : spec.window.right;
  Tensor m = zeros({rows, 1, s_q, s_kv}, {.dtype = DType::boolean});
  bool* mask = m.data<bool>();
  auto position = [](const std::vector<int64_t>& explicit_pos, int64_t token, int64_t slot_start) {
    return explicit_pos.empty() ? token - slot_start : explicit_pos[token];
  };
  for (int64_t n = 0; n < info.num_sequences(); ++n) {
    for (int64_t i = 0; i < info.q_length(n); ++i) {
      const int64_t tq = info.q_start(n) + i;
      const int64_t pq = position(info.q_positions, tq, info.q_start(n));
      for (int64_t j = 0; j < info.kv_length(n); ++j) {
        const int64_t tk = info.kv_start(n) + j;
        const int64_t pk = position(info.kv_positions, tk, info.kv_start(n));
        const bool visible = (right < 0 || pk <= pq + right) && (left < 0 || pk >= pq - left);
        const int64_t row = tq / s_q;
        if (visible) mask[(row * s_q + tq % s_q) * s_kv + tk % s_kv] = true;
      }
    }
  }
  return m;
}

// (rows, heads, seq, dim) view of a tensor in `format`.
inline Tensor to_rows_heads(const Tensor& t, QkvFormat format) {
  switch (format) {
    case QkvFormat::bshd: return permute(t, {0, 2, 1, 3});
    case QkvFormat::sbhd: return permute(t, {1, 2, 0, 3});
    case QkvFormat::thd: return permute(unsqueeze(t, 0), {0, 2, 1, 3});
  }
  return Tensor();
}

inline Tensor from_rows_heads(const Tensor& t, QkvFormat format) {
  switch (format) {
    case QkvFormat::bshd: return permute(t, {0, 2, 1, 3});
    case QkvFormat::sbhd: return permute(t, {2, 0, 1, 3});
    case QkvFormat::thd: return permute(select(t, 0, 0), {1, 0, 2});
  }
  return Tensor();
}

// With an explicit (rows, 1, s_q, s_kv) bool mask (thd: rows = 1).
inline NaiveAttention naive_attention_masked(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionSpec& spec, const Tensor& mask) {
  const QkvFormat f = spec.qkv_format;
  Tensor qh = to_rows_heads(q, f), kh = to_rows_heads(k, f), vh = to_rows_heads(v, f);  // (R, H, S, D)
  const int64_t rows = qh.size(0), h_q = qh.size(1), s_q = qh.size(2), h_kv = kh.size(1), s_kv = kh.size(2);
  const int64_t group = h_q / h_kv;
  auto repeat_heads = [&](const Tensor& t) {  // (R, h_kv, S, D) -> (R, h_q, S, D), GQA sharing
    Tensor e = expand(unsqueeze(t, 2), {rows, h_kv, group, t.size(2), t.size(3)});
    return reshape(e, {rows, h_q, t.size(2), t.size(3)});
  };
  kh = repeat_heads(kh);
  vh = repeat_heads(vh);
  const DType dt = q.dtype();
  const Tensor row_valid =
      raw::compare(raw::CompareOp::gt, raw::sum(raw::to(mask, dt), {-1}, true), 0.0);  // (R,1,Sq,1)
  const double scale = spec.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const double inf = std::numeric_limits<double>::infinity();
  Tensor scores = matmul(qh, transpose(kh, -1, -2)) * scale;  // (R, H, Sq, Skv)
  scores = where(mask, scores, full({}, -inf, {.dtype = dt}));
  scores = where(row_valid, scores, zeros({}, {.dtype = dt}));  // rows that see nothing: no NaN
  Tensor lse = logsumexp(scores, {-1}, true);                   // (R, H, Sq, 1)
  Tensor probs = exp(scores - lse);
  Tensor out = where(row_valid, matmul(probs, vh), zeros({}, {.dtype = dt}));
  lse = squeeze(where(row_valid, lse, full({}, -inf, {.dtype = dt})), -1);  // (R, H, Sq)
  if (f == QkvFormat::thd) lse = select(lse, 0, 0);
  return {from_rows_heads(out, f), lse};
}

inline NaiveAttention naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                      const std::optional<SequenceInfo>& seq) {
  const bool thd = spec.qkv_format == QkvFormat::thd;
  const int64_t rows = thd ? 1 : q.size(spec.qkv_format == QkvFormat::bshd ? 0 : 1);
  const int64_t s_q = thd ? q.size(0) : q.size(spec.qkv_format == QkvFormat::bshd ? 1 : 0);
  const int64_t s_kv = thd ? k.size(0) : k.size(spec.qkv_format == QkvFormat::bshd ? 1 : 0);
  const SequenceInfo info =
      seq ? *seq
          : SequenceInfo::from_lengths(std::vector<int64_t>(rows, s_q), std::vector<int64_t>(rows, s_kv), s_q, s_kv);
  return naive_attention_masked(q, k, v, spec, naive_mask(spec, info, rows, s_q, s_kv));
}

// The oracle with an attention sink (h_q): the softmax runs over the visible keys plus one more
// column holding sink_h, whose value is zero. Rows that see no key keep out = 0 and lse = -inf (the
// rule of attention_sink.h). Built from autograd primitives, so d(sink) comes from the engine.
inline NaiveAttention naive_attention_with_sink(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const AttentionSpec& spec, const std::optional<SequenceInfo>& seq,
                                                const Tensor& sink) {
  const QkvFormat f = spec.qkv_format;
  const bool thd = f == QkvFormat::thd;
  const int64_t rows = thd ? 1 : q.size(f == QkvFormat::bshd ? 0 : 1);
  const int64_t s_q = thd ? q.size(0) : q.size(f == QkvFormat::bshd ? 1 : 0);
  const int64_t s_kv = thd ? k.size(0) : k.size(f == QkvFormat::bshd ? 1 : 0);
  const SequenceInfo info =
      seq ? *seq
          : SequenceInfo::from_lengths(std::vector<int64_t>(rows, s_q), std::vector<int64_t>(rows, s_kv), s_q, s_kv);
  const Tensor mask = naive_mask(spec, info, rows, s_q, s_kv);
  Tensor qh = to_rows_heads(q, f), kh = to_rows_heads(k, f), vh = to_rows_heads(v, f);
  const int64_t h_q = qh.size(1), h_kv = kh.size(1), group = h_q / h_kv;
  auto repeat_heads = [&](const Tensor& t) {
    Tensor e = expand(unsqueeze(t, 2), {rows, h_kv, group, t.size(2), t.size(3)});
    return reshape(e, {rows, h_q, t.size(2), t.size(3)});
  };
  kh = repeat_heads(kh);
  vh = repeat_heads(vh);
  const DType dt = q.dtype();
  const Tensor row_valid = raw::compare(raw::CompareOp::gt, raw::sum(raw::to(mask, dt), {-1}, true), 0.0);
  const double scale = spec.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const double inf = std::numeric_limits<double>::infinity();
  Tensor scores = matmul(qh, transpose(kh, -1, -2)) * scale;
  scores = where(mask, scores, full({}, -inf, {.dtype = dt}));
  const Tensor sink_column = expand(reshape(sink, {1, h_q, 1, 1}), {rows, h_q, s_q, 1});
  Tensor with_sink = cat({scores, sink_column}, -1);  // (R, H, Sq, Skv + 1)
  Tensor lse = logsumexp(with_sink, {-1}, true);
  Tensor probs = narrow(exp(with_sink - lse), -1, 0, s_kv);
  Tensor out = where(row_valid, matmul(probs, vh), zeros({}, {.dtype = dt}));
  lse = squeeze(where(row_valid, lse, full({}, -inf, {.dtype = dt})), -1);
  if (thd) lse = select(lse, 0, 0);
  return {from_rows_heads(out, f), lse};
}

}  // namespace cpf::testing
