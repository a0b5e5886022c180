#pragma once
// CPU flash-attention kernels over a validated AttentionProblem (internal to cpf_attention). All
// pointers are contiguous tensors of the compute type T (float or double) in the problem's format.
// Outputs must be pre-filled by the caller: out/dq/dk/dv with 0, lse with -inf, so storage outside
// every sequence keeps those values.
#include <Eigen/Core>
#include <limits>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "attention/attention_op.h"
#include "attention/attention_problem.h"
#include "attention/mask.h"

namespace cpf::attention_cpu {

template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstRows = Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using Rows = Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>>;

template <class T>
TileStats flash_forward(const AttentionProblem& p, const T* q, const T* k, const T* v, T* out, T* lse);

// dlse may be null (no gradient reaches lse).
template <class T>
TileStats flash_backward(const AttentionProblem& p, const T* q, const T* k, const T* v, const T* out, const T* dout,
                         const T* lse, const T* dlse, T* dq, T* dk, T* dv);

// Sets scores(r, c) = -inf where key c is hidden from query r (a partial tile).
// Flushes denormals to zero on this thread for its lifetime. exp() of scores far below the row maximum
// lands in the denormal range, which x86 processes up to ~100x slower; such probabilities (< 1e-38)
// are indistinguishable from 0 in the result.
class FlushDenormals {
 public:
  FlushDenormals() {
#if defined(__SSE__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040);  // FTZ | DAZ
#endif
  }
  ~FlushDenormals() {
#if defined(__SSE__)
    _mm_setcsr(saved_);
#endif
  }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_ = 0;
};

// exp(x - shift) over a row, with exactly 0 where x = -inf: Eigen 3.4's vectorised exp clamps its
// input and returns ~3e-39 for -inf, and a masked key must get exactly no weight.
template <class Row, class T>
void exp_shifted(Row&& row, T shift, bool has_masked) {
  if (has_masked) {
    row.array() = (row.array() == -std::numeric_limits<T>::infinity()).select(T(0), (row.array() - shift).exp());
  } else {
    row.array() = (row.array() - shift).exp();
  }
}

template <class T>
void mask_tile(Matrix<T>& scores, const int64_t* q_pos, const int64_t* kv_pos, const AttentionWindow& window) {
  for (int64_t r = 0; r < scores.rows(); ++r) {
    for (int64_t c = 0; c < scores.cols(); ++c) {
      if (!position_visible(q_pos[r], kv_pos[c], window)) scores(r, c) = -std::numeric_limits<T>::infinity();
    }
  }
}

// The tile kind of q rows [q0, q0 + rows) against kv columns [k0, k0 + cols) of sequence `s`.
inline TileKind tile_kind(const AttentionProblem& p, const AttentionSequence& s, int64_t q0, int64_t rows, int64_t k0,
                          int64_t cols) {
  return classify_tile(position_range(p.q_pos.data() + s.q_token + q0, rows),
                       position_range(p.kv_pos.data() + s.kv_token + k0, cols), p.window);
}

inline void count_tile(TileStats& stats, TileKind kind) {
  if (kind == TileKind::empty)
    ++stats.skipped;
  else if (kind == TileKind::partial)
    ++stats.partial;
  else
    ++stats.full;
}

}  // namespace cpf::attention_cpu
