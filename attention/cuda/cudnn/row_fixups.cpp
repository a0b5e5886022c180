// Row fix-ups of cuDNN's results (attention/cuda/cudnn/row_fixups.h).
#include "attention/cuda/cudnn/row_fixups.h"

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
  const Tensor idx = device_table(from_vector(index, {static_cast<int64_t>(index.size())}), x.device());
  Tensor out = empty({x.size(0), static_cast<int64_t>(index.size())}, {.dtype = x.dtype(), .device = x.device()});
  device_kernel(x.device(), &DeviceOps::gather, "cudnn attention (lse layout)")(out, x, 1, idx, true);
  return out;
}

namespace {

void check_index(const Tensor& x, const Tensor& index, const char* op) {
  CPF_CHECK(x.is_contiguous() && index.is_contiguous() && index.dim() == 1 && index.dtype() == DType::i64 &&
                index.device() == x.device(),
            op, ": needs a contiguous input and a contiguous 1-d i64 index on its device: input ", x.shape(), " on ",
            x.device(), ", index ", index.dtype(), " ", index.shape(), " on ", index.device());
}

}  // namespace

Tensor packed_lse(const Tensor& stats, const Tensor& index) {
  check_index(stats, index, "packed_lse");
  CPF_CHECK(stats.dim() == 3 && stats.numel() > 0, "packed_lse: Stats must be a non-empty (b, h_q, s_q), got ",
            stats.shape());
  const int64_t b = stats.size(0), h = stats.size(1), s = stats.size(2);
  // (h_q, L) view of the Stats storage: row h starts at stats[0, h, 0]; column n * h_q * s_q + j is
  // stats[n, h, j]. L reaches exactly the last element of row h_q - 1.
  const Tensor rows = raw::as_strided(stats, {h, (b - 1) * h * s + s}, {s, 1}, stats.offset());
  if (stats.device().is_cpu()) return raw::index_select(rows, 1, index);
  Tensor out = empty({h, index.size(0)}, {.dtype = stats.dtype(), .device = stats.device()});
  device_kernel(stats.device(), &DeviceOps::gather, "cudnn attention (lse layout)")(out, rows, 1, index, true);
  return out;
}

Tensor padded_stats(const Tensor& lse, const Tensor& index, int64_t b, int64_t s_q) {
  check_index(lse, index, "padded_stats");
  CPF_CHECK(lse.dim() == 2 && b > 0 && s_q > 0 && index.size(0) == b * s_q, "padded_stats: needs an (h_q, T) lse and ",
            "b * s_q = ", b * s_q, " indices, got lse ", lse.shape(), " and ", index.size(0), " indices");
  const int64_t h = lse.size(0), t = lse.size(1);
  // x[n, h, c] = lse[h, c] for every n; idx[n, h, j] = index[n * s_q + j] for every h (stride-0 views).
  const Tensor x = raw::as_strided(lse, {b, h, t}, {0, t, 1}, lse.offset());
  const Tensor idx = raw::as_strided(index, {b, h, s_q}, {s_q, 0, 1}, index.offset());
  if (lse.device().is_cpu()) return raw::gather(x, 2, idx);
  Tensor out = empty({b, h, s_q}, {.dtype = lse.dtype(), .device = lse.device()});
  device_kernel(lse.device(), &DeviceOps::gather, "cudnn attention (lse layout)")(out, x, 2, idx, false);
  return out;
}

}  // namespace cpf::attention_cuda::cudnn
