// Flash-attention forward on the CPU: one task per (sequence, query head, q block), OpenMP over the
// tasks. Each task keeps a (block_q x d_v) accumulator and walks the KV blocks of its sequence with an
// online softmax:
//
//   S = scale * Q K^T            (block_q x block_kv), -inf where the mask hides a pair
//   m' = max(m, rowmax S)        running row maximum
//   P = exp(S - m'),  l = l * exp(m - m') + rowsum P,  acc = acc * exp(m - m') + P V
//   out = acc / l,  lse = m + log l     (rows with l = 0 saw nothing: out = 0, lse = -inf)
//
// Q, K, V are read in place through strided Eigen maps (one row per token); the only extra memory
// is the per-task tile scratch.
#include <cmath>
#include <limits>
#include <vector>

#include "attention/cpu/flash_kernels.h"

namespace cpf::attention_cpu {
namespace {

struct ForwardTask {
  int64_t sequence, head, q0;
};

template <class T>
TileStats forward_task(const AttentionProblem& p, const ForwardTask& task, const T* q, const T* k, const T* v, T* out,
                       T* lse) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  TileStats stats;
  const AttentionSequence& s = p.sequences[task.sequence];
  const int64_t rows = std::min(p.config.block_q, s.q_len - task.q0);
  const int64_t kv_head = task.head / p.group();
  const ConstRows<T> q_rows(q + p.element_offset(s.q_row, s.q_col + task.q0, p.s_q, task.head, p.h_q, p.d_qk), rows,
                            p.d_qk, Eigen::OuterStride<>(p.token_stride(p.h_q, p.d_qk)));
  const Matrix<T> q_scaled = q_rows * static_cast<T>(p.scale);  // (rows, d_qk)
  const int64_t* q_pos = p.q_pos.data() + s.q_token + task.q0;

  Matrix<T> acc = Matrix<T>::Zero(rows, p.d_v);  // (rows, d_v)
  Matrix<T> scores(rows, p.config.block_kv);     // (rows, block_kv), becomes P in place
  std::vector<T> m(static_cast<size_t>(rows), kNegInf), l(static_cast<size_t>(rows), T(0));

  for (int64_t k0 = 0; k0 < s.kv_len; k0 += p.config.block_kv) {
    const int64_t cols = std::min(p.config.block_kv, s.kv_len - k0);
    const TileKind kind = tile_kind(p, s, task.q0, rows, k0, cols);
    count_tile(stats, kind);
    if (kind == TileKind::empty) continue;
    const ConstRows<T> k_rows(k + p.element_offset(s.kv_row, s.kv_col + k0, p.s_kv, kv_head, p.h_kv, p.d_qk), cols,
                              p.d_qk, Eigen::OuterStride<>(p.token_stride(p.h_kv, p.d_qk)));
    const ConstRows<T> v_rows(v + p.element_offset(s.kv_row, s.kv_col + k0, p.s_kv, kv_head, p.h_kv, p.d_v), cols,
                              p.d_v, Eigen::OuterStride<>(p.token_stride(p.h_kv, p.d_v)));
    scores.resize(rows, cols);
    scores.noalias() = q_scaled * k_rows.transpose();
    if (kind == TileKind::partial) mask_tile(scores, q_pos, p.kv_pos.data() + s.kv_token + k0, p.window);
    for (int64_t r = 0; r < rows; ++r) {
      auto row = scores.row(r);
      const T row_max = row.maxCoeff();
      if (row_max == kNegInf) {  // this tile hides every key from query r: it adds nothing
        row.setZero();
        continue;
      }
      const T m_new = std::max(m[r], row_max);
      const T rescale = std::exp(m[r] - m_new);  // 0 while m was -inf
      exp_shifted(row, m_new, kind == TileKind::partial);
      l[r] = l[r] * rescale + row.sum();
      if (rescale != T(1)) acc.row(r) *= rescale;
      m[r] = m_new;
    }
    acc.noalias() += scores * v_rows;
  }

  Rows<T> out_rows(out + p.element_offset(s.q_row, s.q_col + task.q0, p.s_q, task.head, p.h_q, p.d_v), rows, p.d_v,
                   Eigen::OuterStride<>(p.token_stride(p.h_q, p.d_v)));
  T* lse_row = lse + p.lse_offset(s.q_row, task.head, s.q_col + task.q0);
  for (int64_t r = 0; r < rows; ++r) {
    if (l[r] > T(0)) {  // rows that saw no key keep the caller's out = 0 and lse = -inf
      out_rows.row(r) = acc.row(r) / l[r];
      lse_row[r] = m[r] + std::log(l[r]);
    }
  }
  return stats;
}

}  // namespace

template <class T>
TileStats flash_forward(const AttentionProblem& p, const T* q, const T* k, const T* v, T* out, T* lse) {
  std::vector<ForwardTask> tasks;
  for (int64_t n = 0; n < static_cast<int64_t>(p.sequences.size()); ++n) {
    for (int64_t h = 0; h < p.h_q; ++h) {
      for (int64_t q0 = 0; q0 < p.sequences[n].q_len; q0 += p.config.block_q) tasks.push_back({n, h, q0});
    }
  }
  int64_t full = 0, partial = 0, skipped = 0;
  const int64_t count = static_cast<int64_t>(tasks.size());
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : full, partial, skipped)
#endif
  for (int64_t i = 0; i < count; ++i) {
    const FlushDenormals flush;
    const TileStats t = forward_task(p, tasks[i], q, k, v, out, lse);
    full += t.full;
    partial += t.partial;
    skipped += t.skipped;
  }
  return {full, partial, skipped};
}

template TileStats flash_forward<float>(const AttentionProblem&, const float*, const float*, const float*, float*,
                                        float*);
template TileStats flash_forward<double>(const AttentionProblem&, const double*, const double*, const double*, double*,
                                         double*);

}  // namespace cpf::attention_cpu
