#include "attention/cuda/cudnn/graph_building.h"

#include <sstream>

namespace cpf::attention_cuda::cudnn {
namespace {

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;
constexpr cudnnDataType_t kI32 = CUDNN_DATA_INT32;
constexpr cudnnDataType_t kBool = CUDNN_DATA_BOOLEAN;

Dims dims_of(const Strides4& s) { return {s[0], s[1], s[2], s[3]}; }
// K (b, h, s, d) seen as K^T (b, h, d, s): the first matmul takes K^T expressed by strides, not a copy.
Dims transposed(const Strides4& s) { return {s[0], s[1], s[3], s[2]}; }

// The graph pieces shared by forward and backward: I/O tensors, scalars, lengths and the masks, in
// the op order cudnn-frontend's CompositeSDPANode emits (the fused engine matches these patterns).
class SdpaGraph {
 public:
  explicit SdpaGraph(const SdpaGraphKey& key) : key_(key), io_(static_cast<cudnnDataType_t>(key.io_type)) {
    const int64_t b = key.b, hq = key.h_q, sq = key.s_q, skv = key.s_kv;
    score_dims_ = {b, hq, sq, skv};
    score_strides_ = {hq * sq * skv, sq * skv, skv, 1};
    row_dims_ = {b, hq, sq, 1};
    row_strides_ = {hq * sq, sq, 1, 1};
    if (key.ragged) {
      const cudnnDataType_t type = key.ragged_int64 ? CUDNN_DATA_INT64 : kI32;
      const Dims dims{b + 1, 1, 1, 1}, strides{1, 1, 1, 1};
      offset_q_ = g.tensor(kUidOffsetQ, type, dims, strides);
      offset_k_ = g.tensor(kUidOffsetK, type, dims, strides);
      offset_v_ = g.tensor(kUidOffsetV, type, dims, strides);
      offset_o_ = g.tensor(kUidOffsetO, type, dims, strides);
    }
    if (key.padding) {
      seq_len_q_ = g.tensor(kUidSeqLenQ, kI32, {b, 1, 1, 1}, {1, 1, 1, 1});
      seq_len_kv_ = g.tensor(kUidSeqLenKv, kI32, {b, 1, 1, 1}, {1, 1, 1, 1});
    }
    scale_ = g.scalar(kUidScale, kF32);
    if (key.padding || key.right_bound || key.left_bound) neg_inf_ = g.scalar(kUidNegInf, kF32);
  }

  Desc io_tensor(int64_t uid, int64_t h, int64_t s, int64_t d, const Strides4& strides, Desc ragged) {
    return g.tensor(uid, io_, {key_.b, h, s, d}, dims_of(strides), {.ragged = ragged});
  }
  Desc score() { return g.virtual_tensor(kF32, score_dims_, score_strides_); }
  Desc row_stat() { return g.virtual_tensor(kF32, row_dims_, row_strides_); }
  Desc stats_tensor(int64_t uid) { return g.tensor(uid, kF32, row_dims_, row_strides_); }

  // Rows >= seq_len_q and columns >= seq_len_kv become -inf (attn_score_modifiers.h padding_mask).
  Desc padding_mask(Desc x) {
    Desc row = index(x, 2, kI32), col = index(x, 3, kI32);
    Desc row_ok = g.pointwise(CUDNN_POINTWISE_CMP_LT, row, seq_len_q_, nullptr, mask(), kBool);
    Desc col_ok = g.pointwise(CUDNN_POINTWISE_CMP_LT, col, seq_len_kv_, nullptr, mask(), kBool);
    Desc keep = g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, row_ok, col_ok, nullptr, mask(), kBool);
    return select(x, keep);
  }

  // Keep row (+ seq_len_kv - seq_len_q) (+ r) >= col: the causal diagonal, shifted.
  Desc right_bound_mask(Desc x) {
    Desc row = index(x, 2, kF32), col = index(x, 3, kF32);
    if (key_.bottom_right) {
      row = g.pointwise(CUDNN_POINTWISE_ADD, row, seq_len_kv_, nullptr, int_score(), kI32);
      row = g.pointwise(CUDNN_POINTWISE_SUB, row, seq_len_q_, nullptr, int_score(), kI32);
    }
    if (key_.right_shift) {
      row = g.pointwise(CUDNN_POINTWISE_ADD, row, g.scalar(kUidRightBound, kI32), nullptr, int_score(), kI32);
    }
    Desc keep = g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, mask(), kBool);
    return select(x, keep);
  }

  // Keep col + w (- seq_len_kv + seq_len_q) > row: the sliding window's far edge. w is a FLOAT
  // by-value scalar for the top-left form and INT32 with per-batch lengths, as cudnn-frontend does.
  Desc left_bound_mask(Desc x) {
    if (!key_.bottom_right) {
      Desc row = index(x, 2, kF32), col = index(x, 3, kF32);
      Desc shifted = g.pointwise(CUDNN_POINTWISE_ADD, col, g.scalar(kUidLeftBound, kF32), nullptr, score(), kF32);
      Desc keep = g.pointwise(CUDNN_POINTWISE_CMP_GT, shifted, row, nullptr, mask(), kBool);
      return select(x, keep);
    }
    Desc row = index(x, 2, kI32), col = index(x, 3, kI32);
    Desc shifted = g.pointwise(CUDNN_POINTWISE_ADD, col, g.scalar(kUidLeftBound, kI32), nullptr, int_score(), kI32);
    shifted = g.pointwise(CUDNN_POINTWISE_SUB, shifted, seq_len_kv_, nullptr, int_score(), kI32);
    shifted = g.pointwise(CUDNN_POINTWISE_ADD, shifted, seq_len_q_, nullptr, int_score(), kI32);
    Desc keep = g.pointwise(CUDNN_POINTWISE_CMP_GT, shifted, row, nullptr, mask(), kBool);
    return select(x, keep);
  }

  Desc band_masks(Desc x) {
    if (key_.right_bound) x = right_bound_mask(x);
    if (key_.left_bound) x = left_bound_mask(x);
    return x;
  }

  const SdpaGraphKey& key_;
  const cudnnDataType_t io_;
  GraphBuilder g;
  Desc offset_q_ = nullptr, offset_k_ = nullptr, offset_v_ = nullptr, offset_o_ = nullptr;
  Desc seq_len_q_ = nullptr, seq_len_kv_ = nullptr, scale_ = nullptr, neg_inf_ = nullptr;
  Dims score_dims_, score_strides_, row_dims_, row_strides_;

 private:
  Desc index(Desc x, int64_t axis, cudnnDataType_t precision) {
    return g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, int_score(), precision, axis);
  }
  Desc int_score() { return g.virtual_tensor(kI32, score_dims_, score_strides_); }
  Desc mask() { return g.virtual_tensor(kBool, score_dims_, score_strides_); }
  // y = keep ? x : -inf
  Desc select(Desc x, Desc keep) {
    return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, neg_inf_, keep, score(), kF32);
  }
};

// Section 3: S = scale * Q K^T, masks, softmax with Stats = max + log(sum), O = P V.
std::unique_ptr<ExecutionPlan> build_forward(const SdpaGraphKey& key, cudnnHandle_t handle, std::string* failure) {
  SdpaGraph s(key);
  GraphBuilder& g = s.g;
  const int64_t b = key.b;
  Desc q = s.io_tensor(kUidQ, key.h_q, key.s_q, key.d_qk, key.q, s.offset_q_);
  Desc kt = g.tensor(kUidK, s.io_, {b, key.h_kv, key.d_qk, key.s_kv}, transposed(key.k), {.ragged = s.offset_k_});
  Desc v = s.io_tensor(kUidV, key.h_kv, key.s_kv, key.d_v, key.v, s.offset_v_);
  Desc o = s.io_tensor(kUidO, key.h_q, key.s_q, key.d_v, key.o, s.offset_o_);
  Desc stats = s.stats_tensor(kUidStats);

  Desc logits = s.score();
  g.matmul(q, kt, logits, s.seq_len_q_, s.seq_len_kv_);
  Desc scaled = g.pointwise(CUDNN_POINTWISE_MUL, logits, s.scale_, nullptr, s.score(), kF32);
  if (key.padding) scaled = s.padding_mask(scaled);
  scaled = s.band_masks(scaled);

  // With a sink (cudnn-frontend's composite softmax with a sink): the row max also covers the sink
  // logit, and exp(sink - max) joins the row sum, so Stats and the probabilities include it.
  Desc sink = key.sink ? g.tensor(kUidSink, kF32, {1, key.h_q, 1, 1}, {key.h_q, 1, 1, 1}) : nullptr;
  Desc max = s.row_stat();
  if (sink) {
    Desc score_max = s.row_stat();
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, score_max);
    g.pointwise(CUDNN_POINTWISE_MAX, score_max, sink, nullptr, max, kF32);
  } else {
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, max);
  }
  Desc centered = g.pointwise(CUDNN_POINTWISE_SUB, scaled, max, nullptr, s.score(), kF32);
  Desc exps = g.pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, nullptr, s.score(), kF32);
  Desc sum = s.row_stat();
  if (sink) {
    Desc sink_centered = g.pointwise(CUDNN_POINTWISE_SUB, sink, max, nullptr, s.row_stat(), kF32);
    Desc sink_exp = g.pointwise(CUDNN_POINTWISE_EXP, sink_centered, nullptr, nullptr, s.row_stat(), kF32);
    Desc score_sum = s.row_stat();
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, score_sum);
    g.pointwise(CUDNN_POINTWISE_ADD, score_sum, sink_exp, nullptr, sum, kF32);
  } else {
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, sum);
  }
  Desc log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, s.row_stat(), kF32);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, nullptr, stats, kF32);
  // The probabilities feed the second matmul in the I/O type (a requirement of the fused engine).
  Desc probs = g.pointwise(CUDNN_POINTWISE_DIV, exps, sum, nullptr,
                           g.virtual_tensor(s.io_, s.score_dims_, s.score_strides_), kF32);
  g.matmul(probs, v, o, s.seq_len_q_, nullptr, s.seq_len_kv_);
  return g.finish(handle, failure);
}

// Section 5: recompute P = exp(scale * Q K^T - Stats) under the masks, then dV = P^T dO,
// dS = P (dO V^T - rowsum(dO O)) scale, dK = dS^T Q, dQ = dS K. GQA sums the full-head dK/dV over
// each group with a reduction; the deterministic form writes dQ directly (no fp32 accumulator).
std::unique_ptr<ExecutionPlan> build_backward(const SdpaGraphKey& key, cudnnHandle_t handle, std::string* failure) {
  SdpaGraph s(key);
  GraphBuilder& g = s.g;
  const int64_t b = key.b, hq = key.h_q, hk = key.h_kv, sq = key.s_q, skv = key.s_kv;
  Desc q = s.io_tensor(kUidQ, hq, sq, key.d_qk, key.q, s.offset_q_);
  Desc kt = g.tensor(kUidK, s.io_, {b, hk, key.d_qk, skv}, transposed(key.k), {.ragged = s.offset_k_});
  Desc vt = g.tensor(kUidV, s.io_, {b, hk, key.d_v, skv}, transposed(key.v), {.ragged = s.offset_v_});
  Desc o = s.io_tensor(kUidO, hq, sq, key.d_v, key.o, s.offset_o_);
  Desc dout = s.io_tensor(kUidDout, hq, sq, key.d_v, key.o, s.offset_o_);
  Desc stats = s.stats_tensor(kUidStats);
  Desc dq = s.io_tensor(kUidDq, hq, sq, key.d_qk, key.q, s.offset_q_);
  Desc dk = s.io_tensor(kUidDk, hk, skv, key.d_qk, key.k, s.offset_k_);
  Desc dv = s.io_tensor(kUidDv, hk, skv, key.d_v, key.v, s.offset_v_);

  // softmax_sum = rowsum(dO * O) * 1, into a caller-provided fp32 buffer.
  Desc prod =
      g.pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr,
                  g.virtual_tensor(kF32, {b, hq, sq, key.d_v}, {hq * sq * key.d_v, sq * key.d_v, key.d_v, 1}), kF32);
  Desc row_sum = s.row_stat();
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, row_sum);
  Desc softmax_sum = s.stats_tensor(kUidSoftmaxSum);
  g.pointwise(CUDNN_POINTWISE_MUL, row_sum, g.scalar(kUidOne, kF32), nullptr, softmax_sum, kF32);

  Desc logits = s.score();
  g.matmul(q, kt, logits, s.seq_len_q_, s.seq_len_kv_);
  Desc scaled = g.pointwise(CUDNN_POINTWISE_MUL, logits, s.scale_, nullptr, s.score(), kF32);
  if (key.padding) scaled = s.padding_mask(scaled);  // before the Stats subtraction, as the frontend
  Desc shifted = g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, nullptr, s.score(), kF32);
  shifted = s.band_masks(shifted);  // after it
  Desc probs = g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, s.score(), kF32);

  const Dims t_dims{b, hq, skv, sq}, t_strides{hq * sq * skv, sq * skv, 1, skv};  // (.., s_kv, s_q) views
  auto head_sum = [&](Desc a, Desc bm, Desc out, int64_t d) {
    // GQA/MQA: the full-head gradient (virtual, I/O type) summed over each group of query heads.
    if (hq == hk) {
      g.matmul(a, bm, out, s.seq_len_kv_, nullptr, s.seq_len_q_);
      return;
    }
    Desc full = g.virtual_tensor(s.io_, {b, hq, skv, d}, {hq * skv * d, skv * d, d, 1});
    g.matmul(a, bm, full, s.seq_len_kv_, nullptr, s.seq_len_q_);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };

  Desc probs_t = g.virtual_tensor(s.io_, t_dims, t_strides);
  g.reshape(probs, probs_t);
  head_sum(probs_t, dout, dv, key.d_v);

  Desc dp = s.score();
  g.matmul(dout, vt, dp, s.seq_len_q_, s.seq_len_kv_);
  Desc centered = g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, s.score(), kF32);
  Desc weighted = g.pointwise(CUDNN_POINTWISE_MUL, centered, probs, nullptr, s.score(), kF32);
  Desc ds = g.pointwise(CUDNN_POINTWISE_MUL, weighted, s.scale_, nullptr, s.score(), kF32);

  Desc ds_t = g.virtual_tensor(s.io_, t_dims, t_strides);
  g.reshape(ds, ds_t);
  head_sum(ds_t, q, dk, key.d_qk);

  // K recovered from K^T by a reshape; it carries K's ragged offsets.
  Desc k = g.tensor(-1, s.io_, {b, hk, skv, key.d_qk}, dims_of(key.k), {.is_virtual = true, .ragged = s.offset_k_});
  g.reshape(kt, k);
  if (key.deterministic) {
    g.matmul(ds, k, dq, s.seq_len_q_, nullptr, s.seq_len_kv_);
  } else {
    Desc accum = g.tensor(kUidDqAccum, kF32, {b, hq, sq, key.d_qk}, {hq * sq * key.d_qk, sq * key.d_qk, key.d_qk, 1});
    g.matmul(ds, k, accum, s.seq_len_q_, nullptr, s.seq_len_kv_);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, accum, nullptr, nullptr, dq, kF32);
  }
  return g.finish(handle, failure);
}

// The forward in FP8, in the op order of cudnn-frontend's SDPA_FP8 node (the fused engine matches it):
// S = Q K^T * scale * descale_q * descale_k, the causal mask, softmax with Stats, amax_s = max P,
// P in E4M3 = P * scale_s, O = (P V) * descale_s * descale_v, amax_o = max |O| (before O's own scale),
// O in E4M3 = O * scale_o. The scales and amaxes are (1, 1, 1, 1) f32 device tensors.
std::unique_ptr<ExecutionPlan> build_fp8_forward(const SdpaGraphKey& key, cudnnHandle_t handle, std::string* failure) {
  SdpaGraph s(key);
  GraphBuilder& g = s.g;
  const int64_t b = key.b;
  const Dims unit_dims{1, 1, 1, 1};
  const auto unit = [&](int64_t uid) { return g.tensor(uid, kF32, unit_dims, unit_dims); };
  Desc q = s.io_tensor(kUidQ, key.h_q, key.s_q, key.d_qk, key.q, nullptr);
  Desc kt = g.tensor(kUidK, s.io_, {b, key.h_kv, key.d_qk, key.s_kv}, transposed(key.k));
  Desc v = s.io_tensor(kUidV, key.h_kv, key.s_kv, key.d_v, key.v, nullptr);
  Desc o = s.io_tensor(kUidO, key.h_q, key.s_q, key.d_v, key.o, nullptr);
  Desc stats = s.stats_tensor(kUidStats);

  Desc logits = s.score();
  g.matmul(q, kt, logits);
  Desc scaled = g.pointwise(CUDNN_POINTWISE_MUL, logits, s.scale_, nullptr, s.score(), kF32);
  scaled = g.pointwise(CUDNN_POINTWISE_MUL, scaled, unit(kUidDescaleQ), nullptr, s.score(), kF32);
  scaled = g.pointwise(CUDNN_POINTWISE_MUL, scaled, unit(kUidDescaleK), nullptr, s.score(), kF32);
  scaled = s.band_masks(scaled);
  Desc max = s.row_stat();
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, max);
  Desc centered = g.pointwise(CUDNN_POINTWISE_SUB, scaled, max, nullptr, s.score(), kF32);
  Desc exps = g.pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, nullptr, s.score(), kF32);
  Desc sum = s.row_stat();
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, sum);
  Desc log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, s.row_stat(), kF32);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, nullptr, stats, kF32);
  Desc probs = g.pointwise(CUDNN_POINTWISE_DIV, exps, sum, nullptr, s.score(), kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, probs, unit(kUidAmaxS));
  Desc probs8 = g.pointwise(CUDNN_POINTWISE_MUL, probs, unit(kUidScaleS), nullptr,
                            g.virtual_tensor(s.io_, s.score_dims_, s.score_strides_), kF32);
  const Dims o_dims{b, key.h_q, key.s_q, key.d_v};
  Desc out = g.virtual_tensor(kF32, o_dims, dims_of(key.o));
  g.matmul(probs8, v, out);
  out = g.pointwise(CUDNN_POINTWISE_MUL, out, unit(kUidDescaleS), nullptr,
                    g.virtual_tensor(kF32, o_dims, dims_of(key.o)), kF32);
  out = g.pointwise(CUDNN_POINTWISE_MUL, out, unit(kUidDescaleV), nullptr,
                    g.virtual_tensor(kF32, o_dims, dims_of(key.o)), kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, out, unit(kUidScaleO), nullptr, o, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, out, unit(kUidAmaxO));
  return g.finish(handle, failure);
}

// An FP8 matmul of the backward as cudnn-frontend's matmul_fp8 node emits it: C (f32) = A B, summed over
// each group of query heads when C has fewer heads (GQA), times descale_a and descale_b; amax_c = max |C|;
// c = C * scale_c in c's FP8 type. C is (b, heads, rows, cols) row-major.
void fp8_matmul(GraphBuilder& g, const SdpaGraphKey& key, Desc a, Desc bm, Desc descale_a, Desc descale_b, Desc scale_c,
                Desc c, Desc amax_c, int64_t heads, int64_t rows, int64_t cols) {
  const auto f32 = [&](int64_t h) {
    return g.virtual_tensor(kF32, {key.b, h, rows, cols}, {h * rows * cols, rows * cols, cols, 1});
  };
  Desc acc = f32(key.h_q);
  g.matmul(a, bm, acc);
  if (heads != key.h_q) {
    Desc grouped = f32(heads);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, acc, grouped);
    acc = grouped;
  }
  acc = g.pointwise(CUDNN_POINTWISE_MUL, acc, descale_a, nullptr, f32(heads), kF32);
  acc = g.pointwise(CUDNN_POINTWISE_MUL, acc, descale_b, nullptr, f32(heads), kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, acc, scale_c, nullptr, c, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, acc, amax_c);
}

// The backward in FP8, in the op order of cudnn-frontend's SDPA_FP8_backward node: softmax_sum = rowsum(dO O)
// * descale_dO * descale_O; P = exp(S * scale * descale_q * descale_k - Stats) under the causal mask, cast
// to E4M3 by scale_S; dV = P^T dO; dP = (dO V^T * descales - softmax_sum) * P * scale, its amax, cast by
// scale_dP; dQ = dP K; dK = dP^T Q (each fp8_matmul). Hopper takes only head dim 128 and FP8 gradients.
std::unique_ptr<ExecutionPlan> build_fp8_backward(const SdpaGraphKey& key, cudnnHandle_t handle, std::string* failure) {
  SdpaGraph s(key);
  GraphBuilder& g = s.g;
  const int64_t b = key.b, hq = key.h_q, hk = key.h_kv, sq = key.s_q, skv = key.s_kv;
  const auto grad = static_cast<cudnnDataType_t>(key.fp8_grad_type);
  const Dims unit_dims{1, 1, 1, 1};
  const auto unit = [&](int64_t uid) { return g.tensor(uid, kF32, unit_dims, unit_dims); };
  Desc q = s.io_tensor(kUidQ, hq, sq, key.d_qk, key.q, nullptr);
  Desc kt = g.tensor(kUidK, s.io_, {b, hk, key.d_qk, skv}, transposed(key.k));
  Desc vt = g.tensor(kUidV, s.io_, {b, hk, key.d_v, skv}, transposed(key.v));
  Desc o = s.io_tensor(kUidO, hq, sq, key.d_v, key.o, nullptr);
  Desc dout = g.tensor(kUidDout, grad, {b, hq, sq, key.d_v}, dims_of(key.o));
  Desc stats = s.stats_tensor(kUidStats);
  Desc descale_q = unit(kUidDescaleQ), descale_k = unit(kUidDescaleK), descale_dout = unit(kUidDescaleDout);
  Desc descale_dp = unit(kUidDescaleDp);

  Desc prod =
      g.pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr,
                  g.virtual_tensor(kF32, {b, hq, sq, key.d_v}, {hq * sq * key.d_v, sq * key.d_v, key.d_v, 1}), kF32);
  Desc row_sum = s.row_stat();
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, row_sum);
  row_sum = g.pointwise(CUDNN_POINTWISE_MUL, row_sum, descale_dout, nullptr, s.row_stat(), kF32);
  Desc softmax_sum = g.pointwise(CUDNN_POINTWISE_MUL, row_sum, unit(kUidDescaleO), nullptr, s.row_stat(), kF32);

  Desc logits = s.score();
  g.matmul(q, kt, logits);
  Desc scaled = g.pointwise(CUDNN_POINTWISE_MUL, logits, s.scale_, nullptr, s.score(), kF32);
  scaled = g.pointwise(CUDNN_POINTWISE_MUL, scaled, descale_q, nullptr, s.score(), kF32);
  scaled = g.pointwise(CUDNN_POINTWISE_MUL, scaled, descale_k, nullptr, s.score(), kF32);
  scaled = s.band_masks(scaled);
  Desc shifted = g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, nullptr, s.score(), kF32);
  Desc probs = g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, s.score(), kF32);
  Desc probs8 = g.pointwise(CUDNN_POINTWISE_MUL, probs, unit(kUidScaleS), nullptr,
                            g.virtual_tensor(s.io_, s.score_dims_, s.score_strides_), kF32);
  const Dims t_dims{b, hq, skv, sq}, t_strides{hq * sq * skv, sq * skv, 1, skv};  // (.., s_kv, s_q) views
  Desc probs8_t = g.virtual_tensor(s.io_, t_dims, t_strides);
  g.reshape(probs8, probs8_t);
  Desc dv = g.tensor(kUidDv, grad, {b, hk, skv, key.d_v}, dims_of(key.v));
  fp8_matmul(g, key, probs8_t, dout, unit(kUidDescaleS), descale_dout, unit(kUidScaleDv), dv, unit(kUidAmaxDv), hk, skv,
             key.d_v);

  Desc dp = s.score();
  g.matmul(dout, vt, dp);
  dp = g.pointwise(CUDNN_POINTWISE_MUL, dp, descale_dout, nullptr, s.score(), kF32);
  dp = g.pointwise(CUDNN_POINTWISE_MUL, dp, unit(kUidDescaleV), nullptr, s.score(), kF32);
  dp = g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, s.score(), kF32);
  dp = g.pointwise(CUDNN_POINTWISE_MUL, dp, probs, nullptr, s.score(), kF32);
  dp = g.pointwise(CUDNN_POINTWISE_MUL, dp, s.scale_, nullptr, s.score(), kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, dp, unit(kUidAmaxDp));
  Desc dp8 = g.pointwise(CUDNN_POINTWISE_MUL, dp, unit(kUidScaleDp), nullptr,
                         g.virtual_tensor(grad, s.score_dims_, s.score_strides_), kF32);

  Desc k = g.tensor(-1, s.io_, {b, hk, skv, key.d_qk}, dims_of(key.k), {.is_virtual = true});
  g.reshape(kt, k);
  Desc dq = g.tensor(kUidDq, grad, {b, hq, sq, key.d_qk}, dims_of(key.q));
  fp8_matmul(g, key, dp8, k, descale_dp, descale_k, unit(kUidScaleDq), dq, unit(kUidAmaxDq), hq, sq, key.d_qk);
  Desc dp8_t = g.virtual_tensor(grad, t_dims, t_strides);
  g.reshape(dp8, dp8_t);
  Desc dk = g.tensor(kUidDk, grad, {b, hk, skv, key.d_qk}, dims_of(key.k));
  fp8_matmul(g, key, dp8_t, q, descale_dp, descale_q, unit(kUidScaleDk), dk, unit(kUidAmaxDk), hk, skv, key.d_qk);
  return g.finish(handle, failure);
}

// Why an FP8 key cannot be built, or "": the FP8 graphs have no masks but the causal one.
std::string fp8_unsupported(const SdpaGraphKey& key) {
  if (key.padding || key.ragged || key.left_bound || key.right_shift || key.bottom_right || key.sink) {
    return "FP8 attention takes dense (bshd) inputs with no mask or the causal one only";
  }
  if (key.backward && key.fp8_grad_type != CUDNN_DATA_FP8_E5M2 && key.fp8_grad_type != CUDNN_DATA_FP8_E4M3) {
    return "the FP8 attention backward writes FP8 gradients (E5M2 or E4M3)";
  }
  return "";
}

}  // namespace

std::string SdpaGraphKey::str() const {
  std::ostringstream os;
  os << (backward ? "bwd" : "fwd") << " b=" << b << " hq=" << h_q << " hkv=" << h_kv << " sq=" << s_q << " skv=" << s_kv
     << " dqk=" << d_qk << " dv=" << d_v << (padding ? " padding" : "") << (ragged ? " ragged" : "")
     << (ragged_int64 ? "64" : "") << (right_bound ? " right_bound" : "") << (right_shift ? "+shift" : "")
     << (left_bound ? " left_bound" : "") << (bottom_right ? " bottom_right" : "")
     << (backward && deterministic ? " deterministic" : "") << (!backward && sink ? " sink" : "")
     << (fp8 ? " fp8" : "");
  return os.str();
}

std::unique_ptr<ExecutionPlan> build_sdpa_plan(const SdpaGraphKey& key, cudnnHandle_t handle, std::string* failure) {
  if (key.fp8) {
    *failure = fp8_unsupported(key);
    if (!failure->empty()) return nullptr;
    return key.backward ? build_fp8_backward(key, handle, failure) : build_fp8_forward(key, handle, failure);
  }
  return key.backward ? build_backward(key, handle, failure) : build_forward(key, handle, failure);
}

}  // namespace cpf::attention_cuda::cudnn
