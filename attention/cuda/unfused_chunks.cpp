// Chunking of the unfused attention path (unfused_chunks.h).
#include "attention/cuda/unfused_chunks.h"

#include <algorithm>

namespace cpf::attention_cuda::unfused {
namespace {

bool has_work(const AttentionSequence& s) { return s.q_len > 0 && s.kv_len > 0; }

bool window_bounded(const AttentionProblem& p) { return p.window.left >= 0 || p.window.right >= 0; }

bool keys_sorted(const AttentionProblem& p, const AttentionSequence& s) {
  const int64_t* kp = p.kv_pos.data() + s.kv_token;
  return std::is_sorted(kp, kp + s.kv_len);
}

std::pair<int64_t, int64_t> columns(const AttentionProblem& p, const AttentionSequence& s, int64_t r0, int64_t rows,
                                    bool skip) {
  if (!skip) return {0, s.kv_len};
  const int64_t* kp = p.kv_pos.data() + s.kv_token;
  const int64_t* qp = p.q_pos.data() + s.q_token + r0;
  const auto [qmin, qmax] = std::minmax_element(qp, qp + rows);
  int64_t lo = 0, hi = s.kv_len;
  if (p.window.left >= 0) lo = std::lower_bound(kp, kp + s.kv_len, *qmin - p.window.left) - kp;
  if (p.window.right >= 0) hi = std::upper_bound(kp, kp + s.kv_len, *qmax + p.window.right) - kp;
  return {lo, std::max(lo, hi)};
}

struct RowBlock {
  int64_t kv_heads = 1, rows = 1;
};

// As many rows as the budget allows (capped at kSkipRowBlock when keys can be skipped), then as many
// kv heads as fit beside them.
RowBlock chunk_shape(const AttentionProblem& p, const AttentionSequence& s, size_t bytes_per_score, size_t budget,
                     bool skip) {
  const size_t per_row = std::max<size_t>(static_cast<size_t>(s.kv_len) * bytes_per_score, 1);
  const int64_t rows_fit = std::max<int64_t>(1, static_cast<int64_t>(budget / per_row));
  const int64_t rows = std::min({s.q_len, rows_fit, skip ? kSkipRowBlock : s.q_len});
  return {std::clamp<int64_t>(rows_fit / rows, 1, p.h_kv), rows};
}

}  // namespace

std::pair<int64_t, int64_t> visible_columns(const AttentionProblem& p, const AttentionSequence& s, int64_t r0,
                                            int64_t rows) {
  return columns(p, s, r0, rows, window_bounded(p) && keys_sorted(p, s));
}

int64_t chunk_elements(const AttentionProblem& p, size_t bytes_per_score, size_t budget) {
  int64_t most = 0;
  for (const AttentionSequence& s : p.sequences) {
    if (!has_work(s)) continue;
    const RowBlock c = chunk_shape(p, s, bytes_per_score, budget, window_bounded(p) && keys_sorted(p, s));
    most = std::max(most, c.kv_heads * c.rows * s.kv_len);
  }
  return most;
}

void for_each_chunk(const AttentionProblem& p, size_t bytes_per_score, size_t budget,
                    const std::function<void(const Chunk&)>& fn) {
  for (const AttentionSequence& s : p.sequences) {
    if (!has_work(s)) continue;
    const bool skip = window_bounded(p) && keys_sorted(p, s);
    const RowBlock shape = chunk_shape(p, s, bytes_per_score, budget, skip);
    for (int64_t g0 = 0; g0 < p.h_kv; g0 += shape.kv_heads) {
      for (int64_t r0 = 0; r0 < s.q_len; r0 += shape.rows) {
        const int64_t rows = std::min(shape.rows, s.q_len - r0);
        const auto [c0, c1] = columns(p, s, r0, rows, skip);
        if (c1 <= c0) continue;  // no row of the block sees a key: out 0, lse -inf, zero gradients
        for (int64_t j = 0; j < p.group(); ++j) {
          fn(Chunk{&s, g0, std::min(shape.kv_heads, p.h_kv - g0), r0, rows, j, c0, c1 - c0});
        }
      }
    }
  }
}

}  // namespace cpf::attention_cuda::unfused
