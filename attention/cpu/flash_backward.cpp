// Flash-attention backward on the CPU (FlashAttention-2, Algorithm 2). Nothing of size s^2 is
// stored: each tile recomputes its probabilities from the saved lse,
//
//   P  = exp(scale * Q K^T - lse)        0 where masked and in rows with lse = -inf
//   dV += P^T dO
//   dP = dO V^T
//   dS = P * (dP - D),  D = rowsum(dO * O) - dlse     (dlse: the gradient reaching lse)
//   dQ += scale * dS K,   dK += scale * dS^T Q
//
// Two schedules, both deterministic (every sum runs in a fixed order whatever the thread count):
//   by_kv_head: one task per (sequence, kv head) owns dK/dV of that head and dQ of its query heads;
//   split:      dK/dV per (sequence, kv head, kv block), then dQ per (sequence, head, q block); it
//               recomputes P and dP once more but has many more tasks (few heads, long sequences).
#include <cmath>
#include <limits>
#include <vector>

#include "attention/cpu/flash_kernels.h"
#include "framework/tensor/cpu/strided_loop.h"

namespace cpf::attention_cpu {
namespace {

template <class T>
struct BackwardContext {
  const AttentionProblem& p;
  const T *q, *k, *v, *dout, *lse;
  const T* delta;  // D - dlse, laid out like lse
  T *dq, *dk, *dv;
};

// One tile: q rows [q0, q0 + rows) of `head` against kv rows [k0, k0 + cols). Accumulates into
// dk_acc/dv_acc (cols x d) when they are given, and into dq in place when want_dq.
template <class T>
TileKind backward_tile(const BackwardContext<T>& c, const AttentionSequence& s, int64_t head, int64_t q0, int64_t k0,
                       Matrix<T>* dk_acc, Matrix<T>* dv_acc, bool want_dq) {
  const AttentionProblem& p = c.p;
  const int64_t rows = std::min(p.config.block_q, s.q_len - q0);
  const int64_t cols = std::min(p.config.block_kv, s.kv_len - k0);
  const TileKind kind = tile_kind(p, s, q0, rows, k0, cols);
  if (kind == TileKind::empty) return kind;
  const int64_t kv_head = head / p.group();
  const T scale = static_cast<T>(p.scale);
  const Eigen::OuterStride<> q_stride(p.token_stride(p.h_q, p.d_qk)), o_stride(p.token_stride(p.h_q, p.d_v));
  const Eigen::OuterStride<> k_stride(p.token_stride(p.h_kv, p.d_qk)), v_stride(p.token_stride(p.h_kv, p.d_v));
  const int64_t q_off = p.element_offset(s.q_row, s.q_col + q0, p.s_q, head, p.h_q, p.d_qk);
  const int64_t o_off = p.element_offset(s.q_row, s.q_col + q0, p.s_q, head, p.h_q, p.d_v);
  const int64_t k_off = p.element_offset(s.kv_row, s.kv_col + k0, p.s_kv, kv_head, p.h_kv, p.d_qk);
  const int64_t v_off = p.element_offset(s.kv_row, s.kv_col + k0, p.s_kv, kv_head, p.h_kv, p.d_v);
  const ConstRows<T> q_rows(c.q + q_off, rows, p.d_qk, q_stride);     // (rows, d_qk)
  const ConstRows<T> do_rows(c.dout + o_off, rows, p.d_v, o_stride);  // (rows, d_v)
  const ConstRows<T> k_rows(c.k + k_off, cols, p.d_qk, k_stride);     // (cols, d_qk)
  const ConstRows<T> v_rows(c.v + v_off, cols, p.d_v, v_stride);      // (cols, d_v)
  const T* lse = c.lse + p.lse_offset(s.q_row, head, s.q_col + q0);
  const T* delta = c.delta + p.lse_offset(s.q_row, head, s.q_col + q0);

  Matrix<T> probs = (q_rows * scale) * k_rows.transpose();  // (rows, cols)
  if (kind == TileKind::partial) {
    mask_tile(probs, p.q_pos.data() + s.q_token + q0, p.kv_pos.data() + s.kv_token + k0, p.window);
  }
  for (int64_t r = 0; r < rows; ++r) {
    // A row with lse = -inf saw no key: its probabilities are 0 (exp(-inf + inf) would be NaN).
    if (lse[r] == -std::numeric_limits<T>::infinity())
      probs.row(r).setZero();
    else
      exp_shifted(probs.row(r), lse[r], kind == TileKind::partial);
  }
  if (dv_acc) dv_acc->noalias() += probs.transpose() * do_rows;
  Matrix<T> dscores = do_rows * v_rows.transpose();  // dP, then dS in place: (rows, cols)
  for (int64_t r = 0; r < rows; ++r) {
    dscores.row(r).array() = probs.row(r).array() * (dscores.row(r).array() - delta[r]);
  }
  if (want_dq) {
    Rows<T> dq_rows(c.dq + q_off, rows, p.d_qk, q_stride);
    dq_rows.noalias() += scale * (dscores * k_rows);
  }
  if (dk_acc) dk_acc->noalias() += scale * (dscores.transpose() * q_rows);
  return kind;
}

template <class T>
void store_kv_grads(const BackwardContext<T>& c, const AttentionSequence& s, int64_t kv_head, int64_t k0,
                    const Matrix<T>& dk_acc, const Matrix<T>& dv_acc) {
  const AttentionProblem& p = c.p;
  Rows<T>(c.dk + p.element_offset(s.kv_row, s.kv_col + k0, p.s_kv, kv_head, p.h_kv, p.d_qk), dk_acc.rows(), p.d_qk,
          Eigen::OuterStride<>(p.token_stride(p.h_kv, p.d_qk))) = dk_acc;
  Rows<T>(c.dv + p.element_offset(s.kv_row, s.kv_col + k0, p.s_kv, kv_head, p.h_kv, p.d_v), dv_acc.rows(), p.d_v,
          Eigen::OuterStride<>(p.token_stride(p.h_kv, p.d_v))) = dv_acc;
}

// dK/dV of kv block [k0, ...) of `kv_head`, summed over its query heads and q blocks; optionally dQ.
template <class T>
TileStats kv_block_task(const BackwardContext<T>& c, const AttentionSequence& s, int64_t kv_head, int64_t k0,
                        bool want_dq) {
  const AttentionProblem& p = c.p;
  const int64_t cols = std::min(p.config.block_kv, s.kv_len - k0);
  Matrix<T> dk_acc = Matrix<T>::Zero(cols, p.d_qk), dv_acc = Matrix<T>::Zero(cols, p.d_v);
  TileStats stats;
  for (int64_t head = kv_head * p.group(); head < (kv_head + 1) * p.group(); ++head) {
    for (int64_t q0 = 0; q0 < s.q_len; q0 += p.config.block_q) {
      count_tile(stats, backward_tile(c, s, head, q0, k0, &dk_acc, &dv_acc, want_dq));
    }
  }
  store_kv_grads(c, s, kv_head, k0, dk_acc, dv_acc);
  return stats;
}

template <class T>
void compute_delta(const AttentionProblem& p, const T* out, const T* dout, const T* dlse, T* delta) {
  const int64_t count = static_cast<int64_t>(p.sequences.size()) * p.h_q;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for schedule(dynamic, 1)
#endif
  for (int64_t i = 0; i < count; ++i) {
    const AttentionSequence& s = p.sequences[i / p.h_q];
    const int64_t head = i % p.h_q;
    const Eigen::OuterStride<> stride(p.token_stride(p.h_q, p.d_v));
    const int64_t off = p.element_offset(s.q_row, s.q_col, p.s_q, head, p.h_q, p.d_v);
    const ConstRows<T> o(out + off, s.q_len, p.d_v, stride), g(dout + off, s.q_len, p.d_v, stride);
    const int64_t l_off = p.lse_offset(s.q_row, head, s.q_col);
    for (int64_t r = 0; r < s.q_len; ++r) {
      delta[l_off + r] = o.row(r).dot(g.row(r)) - (dlse ? dlse[l_off + r] : T(0));
    }
  }
}

}  // namespace

template <class T>
TileStats flash_backward(const AttentionProblem& p, const T* q, const T* k, const T* v, const T* out, const T* dout,
                         const T* lse, const T* dlse, T* dq, T* dk, T* dv) {
  std::vector<T> delta(static_cast<size_t>(p.batch * p.h_q * p.s_q), T(0));
  compute_delta(p, out, dout, dlse, delta.data());
  const BackwardContext<T> c{p, q, k, v, dout, lse, delta.data(), dq, dk, dv};
  const int64_t n_seq = static_cast<int64_t>(p.sequences.size());

  BackwardSchedule schedule = p.config.backward;
  if (schedule == BackwardSchedule::automatic) {
    const int threads = cpu::max_threads();
    schedule = threads == 1 || n_seq * p.h_kv >= 2 * threads ? BackwardSchedule::by_kv_head : BackwardSchedule::split;
  }
  // Plain counters (not a lambda capturing them): OpenMP reductions need the names in the loop body.
  int64_t full = 0, partial = 0, skipped = 0;
  if (schedule == BackwardSchedule::by_kv_head) {
    const int64_t count = n_seq * p.h_kv;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : full, partial, skipped)
#endif
    for (int64_t i = 0; i < count; ++i) {
      const FlushDenormals flush;
      const AttentionSequence& s = p.sequences[i / p.h_kv];
      for (int64_t k0 = 0; k0 < s.kv_len; k0 += p.config.block_kv) {
        const TileStats t = kv_block_task(c, s, i % p.h_kv, k0, true);
        full += t.full;
        partial += t.partial;
        skipped += t.skipped;
      }
    }
    return {full, partial, skipped};
  }

  struct Task {
    int64_t sequence, head, start;
  };
  std::vector<Task> kv_tasks, q_tasks;
  for (int64_t n = 0; n < n_seq; ++n) {
    for (int64_t g = 0; g < p.h_kv; ++g) {
      for (int64_t k0 = 0; k0 < p.sequences[n].kv_len; k0 += p.config.block_kv) kv_tasks.push_back({n, g, k0});
    }
    for (int64_t h = 0; h < p.h_q; ++h) {
      for (int64_t q0 = 0; q0 < p.sequences[n].q_len; q0 += p.config.block_q) q_tasks.push_back({n, h, q0});
    }
  }
  const int64_t kv_count = static_cast<int64_t>(kv_tasks.size()), q_count = static_cast<int64_t>(q_tasks.size());
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : full, partial, skipped)
#endif
  for (int64_t i = 0; i < kv_count; ++i) {
    const FlushDenormals flush;
    const Task& t = kv_tasks[i];
    const TileStats stats = kv_block_task(c, p.sequences[t.sequence], t.head, t.start, false);
    full += stats.full;
    partial += stats.partial;
    skipped += stats.skipped;
  }
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for schedule(dynamic, 1)
#endif
  for (int64_t i = 0; i < q_count; ++i) {
    const FlushDenormals flush;
    const Task& t = q_tasks[i];
    const AttentionSequence& s = p.sequences[t.sequence];
    for (int64_t k0 = 0; k0 < s.kv_len; k0 += p.config.block_kv) {
      backward_tile<T>(c, s, t.head, t.start, k0, nullptr, nullptr, true);
    }
  }
  return {full, partial, skipped};
}

template TileStats flash_backward<float>(const AttentionProblem&, const float*, const float*, const float*,
                                         const float*, const float*, const float*, const float*, float*, float*,
                                         float*);
template TileStats flash_backward<double>(const AttentionProblem&, const double*, const double*, const double*,
                                          const double*, const double*, const double*, const double*, double*, double*,
                                          double*);

}  // namespace cpf::attention_cpu
