// The per-thread cache of row fix-up tables per cuDNN mapping (attention/cuda/cudnn/row_fixup_tables.h).
#include "attention/cuda/cudnn/row_fixup_tables.h"

#include <algorithm>
#include <limits>

#include "attention/cuda/cudnn/row_fixups.h"
#include "attention/cuda/cudnn/strided_layout.h"
#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::attention_cuda::cudnn {
namespace {

struct Entry {
  std::shared_ptr<const SdpaMapping> mapping;  // held: the identity in the key stays unique
  QkvFormat format = QkvFormat::bshd;
  std::array<int64_t, 6> dims{};  // s_q, s_kv, h_q, h_kv, d_qk, d_v
  Device device;
  void* stream = nullptr;
  std::shared_ptr<const RowTables> tables;
};

struct Cache {
  std::vector<Entry> entries;  // most recently used first
  RowTablesStats stats;
};

Cache& thread_cache() {
  thread_local Cache cache;
  return cache;
}

std::array<int64_t, 6> dims_of(const AttentionProblem& p) { return {p.s_q, p.s_kv, p.h_q, p.h_kv, p.d_qk, p.d_v}; }

// The ragged offsets of the dense layouts (attention/cuda/cudnn/strided_layout.h), with set_layouts' choice of width.
void add_dense_offsets(RowTables& t, const SdpaMapping& m, const AttentionProblem& p, const Device& device) {
  const Layouts l = dense_layouts(p);
  t.offset_row_strides = {l.q.row_stride, l.k.row_stride, l.v.row_stride, l.o.row_stride};
  const int64_t largest =
      std::max({p.s_q * l.q.row_stride, p.s_kv * l.k.row_stride, p.s_kv * l.v.row_stride, p.s_q * l.o.row_stride});
  t.offsets_int64 = largest > std::numeric_limits<int32_t>::max();
  const std::array<const std::vector<int64_t>*, 4> first{&m.q_token, &m.kv_token, &m.kv_token, &m.q_token};
  const std::array<int64_t, 4> total{p.s_q, p.s_kv, p.s_kv, p.s_q};
  for (size_t i = 0; i < 4; ++i) {
    t.offsets[i] = raw::to(ragged_offsets(*first[i], total[i], t.offset_row_strides[i], t.offsets_int64), device);
  }
}

// The lengths and the dense offsets one execution binds.
void add_execution_tables(RowTables& t, const SdpaMapping& m, const AttentionProblem& p, const Device& device) {
  if (m.ragged) add_dense_offsets(t, m, p, device);
  if (m.padding) {
    t.seq_len_q = raw::to(from_vector(m.seq_len_q, {m.b}), device);
    t.seq_len_kv = raw::to(from_vector(m.seq_len_kv, {m.b}), device);
  }
}

std::shared_ptr<const RowTables> build(const SdpaMapping& m, const AttentionProblem& p, const Device& device) {
  auto tables = std::make_shared<RowTables>();
  tables->q_runs = flag_runs(m.q_undefined, kMaxFillRuns);
  tables->kv_runs = flag_runs(m.kv_undefined, kMaxFillRuns);
  if (m.ragged) {
    // packed_to_padded's n * s_q + j, as a column of packed_lse's (h_q, b * h_q * s_q) Stats view.
    std::vector<int64_t> lse = packed_to_padded(p, m);
    for (int64_t& v : lse) v = (v / m.s_q) * p.h_q * m.s_q + v % m.s_q;
    const std::vector<int64_t> stats = padded_to_packed(m);
    tables->lse_index = raw::to(from_vector(lse, {static_cast<int64_t>(lse.size())}), device);
    tables->stats_columns = raw::to(from_vector(stats, {static_cast<int64_t>(stats.size())}), device);
  }
  add_execution_tables(*tables, m, p, device);
  return tables;
}

}  // namespace

Tensor ragged_offsets(const std::vector<int64_t>& first_token, int64_t total_tokens, int64_t row_stride, bool int64) {
  std::vector<int64_t> values;
  values.reserve(first_token.size() + 1);
  for (int64_t t : first_token) values.push_back(t * row_stride);
  values.push_back(total_tokens * row_stride);
  const int64_t n = static_cast<int64_t>(values.size());
  if (int64) return from_vector(values, {n});
  return from_vector(std::vector<int32_t>(values.begin(), values.end()), {n});
}

RowTables execution_tables(const SdpaMapping& m, const AttentionProblem& p, const Device& device) {
  CPF_CHECK(m.reason.empty(), "cudnn execution tables: the mapping is unsupported: ", m.reason);
  RowTables tables;
  add_execution_tables(tables, m, p, device);
  return tables;
}

std::shared_ptr<const RowTables> row_tables(const std::shared_ptr<const SdpaMapping>& m, const AttentionProblem& p,
                                            const Device& device) {
  CPF_CHECK(m != nullptr, "cudnn row tables: no mapping");
  CPF_CHECK(m->reason.empty(), "cudnn row tables: the mapping is unsupported: ", m->reason);
  Cache& cache = thread_cache();
  void* stream = DeviceStream::current(device).handle();
  const auto hit = std::find_if(cache.entries.begin(), cache.entries.end(), [&](const Entry& e) {
    return e.mapping == m && e.format == p.format && e.dims == dims_of(p) && e.device == device && e.stream == stream;
  });
  if (hit != cache.entries.end()) {
    std::rotate(cache.entries.begin(), hit, hit + 1);
    ++cache.stats.hits;
    return cache.entries.front().tables;
  }
  std::shared_ptr<const RowTables> tables = build(*m, p, device);
  ++cache.stats.builds;
  cache.entries.insert(cache.entries.begin(), Entry{m, p.format, dims_of(p), device, stream, tables});
  if (cache.entries.size() > kRowTablesEntries) cache.entries.pop_back();
  return tables;
}

RowTablesStats row_tables_stats() { return thread_cache().stats; }

}  // namespace cpf::attention_cuda::cudnn
