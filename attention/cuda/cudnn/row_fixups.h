#pragma once
// Row fix-ups that turn cuDNN's results into the attention_op.h contract (private to
// cpf_attention_cuda; used by attention/cuda/cudnn/fused_attention.cpp): the lse between cuDNN's padded (b, h, s) Stats
// and the packed thd (h, T) layout, and the rows cuDNN leaves undefined (SdpaMapping::q_undefined / kv_undefined) set
// to 0 (out, dq, dk, dv) or -inf (lse).
//
// Undefined rows: a ring tile that covers part of a rank's tokens (the upper tile's first query half,
// the lower tile's second key half) leaves them as one run per sequence. thd results with at most
// kMaxFillRuns runs get a fill of those rows only (one write of the run, no mask upload); otherwise a
// masked fill passes over the whole tensor (read, mask, write).
#include <cstdint>
#include <utility>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda::cudnn {

inline constexpr size_t kMaxFillRuns = 8;

// Runs [start, end) of storage tokens.
using RowRuns = std::vector<std::pair<int64_t, int64_t>>;

// The runs [start, end) of set flags in order; empty when there are more than `most` (or none).
std::vector<std::pair<int64_t, int64_t>> flag_runs(const std::vector<uint8_t>& flags, size_t most);

// `t`, a q-side (flags = q_undefined, row_len = s_q) or kv-side (kv_undefined, s_kv) result of `p`'s
// layout, with the flagged storage tokens' rows set to `value`: in place when `t` is contiguous, thd and
// the flags form at most kMaxFillRuns runs, else a new tensor from a masked fill.
Tensor fill_token_rows(const AttentionProblem& p, const Tensor& t, const std::vector<uint8_t>& flags, int64_t row_len,
                       double value);
// The same with flag_runs(flags, kMaxFillRuns) computed before (attention/cuda/cudnn/row_fixup_tables.h keeps them per
// mapping).
Tensor fill_token_rows(const AttentionProblem& p, const Tensor& t, const std::vector<uint8_t>& flags,
                       const RowRuns& runs, int64_t row_len, double value);
// The same for an lse ((B, Hq, S), or (Hq, T) for thd) and q_undefined.
Tensor fill_lse_rows(const AttentionProblem& p, const Tensor& lse, const std::vector<uint8_t>& flags, double value);
Tensor fill_lse_rows(const AttentionProblem& p, const Tensor& lse, const std::vector<uint8_t>& flags,
                     const RowRuns& runs, double value);

// thd: the index, per packed query token, of its row in the padded (b * s_q) Stats rows; and the
// reverse, per padded row, of its packed token (rows past a sequence's end read token 0: never used).
std::vector<int64_t> packed_to_padded(const AttentionProblem& p, const SdpaMapping& m);
std::vector<int64_t> padded_to_packed(const SdpaMapping& m);

// out[:, i] = x[:, index[i]] along dim 1 of a 2-d device tensor.
Tensor select_columns(const Tensor& x, const std::vector<int64_t>& index);

// thd, each in one gather (no permuted copy first); pure data movement, so the values are those of the
// permute-then-select_columns form bit for bit. Indices are i64 on the tensor's device and in range
// (attention/cuda/cudnn/row_fixup_tables.h builds them); a CPU tensor runs raw::index_select / raw::gather (the
// reference). Forward: cuDNN's Stats (b, h_q, s_q), contiguous, to the packed lse (h_q, T) with lse[h, t] = stats[n, h,
// j] where index[t] = n * h_q * s_q + j (token t is entry n's j-th query).
Tensor packed_lse(const Tensor& stats, const Tensor& index);
// Backward: the packed lse (h_q, T), contiguous, to cuDNN's Stats (b, h_q, s_q) with
// stats[n, h, j] = lse[h, index[n * s_q + j]] (index: padded_to_packed).
Tensor padded_stats(const Tensor& lse, const Tensor& index, int64_t b, int64_t s_q);

}  // namespace cpf::attention_cuda::cudnn
