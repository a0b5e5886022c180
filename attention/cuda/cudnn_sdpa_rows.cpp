// Row fix-ups of cuDNN's results (cudnn_sdpa_rows.h).
#include "attention/cuda/cudnn_sdpa_rows.h"

#include "attention/cuda/device_tables.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/index.h"
#include "framework/tensor/ops/views.h"

namespace cpf::attention_cuda::cudnn {
namespace {

// A bool mask over the storage tokens of a q- or kv-side tensor, shaped to broadcast against it:
// bshd (B, S, 1, 1), sbhd (S, B, 1, 1), thd (T, 1, 1). flags are indexed by row * row_len + col.
Tensor token_mask(const AttentionProblem& p, const std::vector<uint8_t>& flags, int64_t row_len, const Device& device) {
  std::vector<bool> values(flags.size());
  if (p.format == QkvFormat::sbhd) {
    for (int64_t col = 0; col < row_len; ++col) {
      for (int64_t row = 0; row < p.batch; ++row) {
        values[static_cast<size_t>(col * p.batch + row)] = flags[static_cast<size_t>(row * row_len + col)] != 0;
      }
    }
    return device_table(from_vector(values, {row_len, p.batch, 1, 1}), device);
  }
  for (size_t i = 0; i < flags.size(); ++i) values[i] = flags[i] != 0;
  if (p.format == QkvFormat::thd) return device_table(from_vector(values, {row_len, 1, 1}), device);
  return device_table(from_vector(values, {p.batch, row_len, 1, 1}), device);
}

// The lse-shaped mask: (B, 1, S), or (1, T) for thd.
Tensor lse_mask(const AttentionProblem& p, const std::vector<uint8_t>& flags, const Device& device) {
  std::vector<bool> values(flags.begin(), flags.end());
  if (p.format == QkvFormat::thd) return device_table(from_vector(values, {1, p.s_q}), device);
  return device_table(from_vector(values, {p.batch, 1, p.s_q}), device);
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> flag_runs(const std::vector<uint8_t>& flags, size_t most) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (size_t i = 0; i < flags.size(); ++i) {
    if (flags[i] == 0) continue;
    if (!runs.empty() && runs.back().second == static_cast<int64_t>(i)) {
      runs.back().second += 1;
      continue;
    }
    if (runs.size() == most) return {};
    runs.push_back({static_cast<int64_t>(i), static_cast<int64_t>(i) + 1});
  }
  return runs;
}

Tensor fill_token_rows(const AttentionProblem& p, const Tensor& t, const std::vector<uint8_t>& flags, int64_t row_len,
                       double value) {
  return fill_token_rows(p, t, flags, flag_runs(flags, kMaxFillRuns), row_len, value);
}

Tensor fill_token_rows(const AttentionProblem& p, const Tensor& t, const std::vector<uint8_t>& flags,
                       const RowRuns& runs, int64_t row_len, double value) {
  // thd: storage token i is row i of dim 0 (T, H, D), so each run is one contiguous block of memory.
  if (runs.empty() || p.format != QkvFormat::thd || !t.is_contiguous()) {
    return raw::masked_fill(t, token_mask(p, flags, row_len, t.device()), value);
  }
  for (const auto& [start, end] : runs) raw::fill_(raw::narrow(t, 0, start, end - start), value);
  return t;
}

Tensor fill_lse_rows(const AttentionProblem& p, const Tensor& lse, const std::vector<uint8_t>& flags, double value) {
  return fill_lse_rows(p, lse, flags, flag_runs(flags, kMaxFillRuns), value);
}

Tensor fill_lse_rows(const AttentionProblem& p, const Tensor& lse, const std::vector<uint8_t>& flags,
                     const RowRuns& runs, double value) {
  // thd lse (Hq, T): a run is a column block of every head row.
  if (runs.empty() || p.format != QkvFormat::thd || !lse.is_contiguous()) {
    return raw::masked_fill(lse, lse_mask(p, flags, lse.device()), value);
  }
  for (const auto& [start, end] : runs) raw::fill_(raw::narrow(lse, 1, start, end - start), value);
  return lse;
}

std::vector<int64_t> packed_to_padded(const AttentionProblem& p, const SdpaMapping& m) {
  std::vector<int64_t> index(static_cast<size_t>(p.s_q), 0);
  for (int64_t n = 0; n < m.b; ++n) {
    for (int64_t j = 0; j < m.seq_len_q[static_cast<size_t>(n)]; ++j) {
      index[static_cast<size_t>(m.q_token[static_cast<size_t>(n)] + j)] = n * m.s_q + j;
    }
  }
  return index;
}

std::vector<int64_t> padded_to_packed(const SdpaMapping& m) {
  std::vector<int64_t> index(static_cast<size_t>(m.b * m.s_q), 0);
  for (int64_t n = 0; n < m.b; ++n) {
    for (int64_t j = 0; j < m.seq_len_q[static_cast<size_t>(n)]; ++j) {
      index[static_cast<size_t>(n * m.s_q + j)] = m.q_token[static_cast<size_t>(n)] + j;
    }
  }
  return index;
}

// out[:, i] = x[:, index[i]] along dim 1 through the device kernel directly: the indices are built
// here and in range, and raw::index_select would copy them back to the host to check them.
Tensor select_columns(const Tensor& x, const std::vector<int64_t>& index) {
  return select_columns(x, device_table(from_vector(index, {static_cast<int64_t>(index.size())}), x.device()));
}

Tensor select_columns(const Tensor& x, const Tensor& idx) {
  CPF_CHECK(idx.dtype() == DType::i64 && idx.dim() == 1 && idx.device() == x.device() && x.dim() == 2,
            "select_columns: needs a 2-d x and a 1-d i64 index on its device: x ", x.shape(), " on ", x.device(),
            ", index ", idx.dtype(), " ", idx.shape(), " on ", idx.device());
  Tensor out = empty({x.size(0), idx.size(0)}, {.dtype = x.dtype(), .device = x.device()});
  device_kernel(x.device(), &DeviceOps::gather, "cudnn attention (lse layout)")(out, x, 1, idx, true);
  return out;
}

}  // namespace cpf::attention_cuda::cudnn
