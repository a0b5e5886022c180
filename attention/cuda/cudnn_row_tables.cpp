// The per-thread cache of row fix-up tables per cuDNN mapping (cudnn_row_tables.h).
#include "attention/cuda/cudnn_row_tables.h"

#include <algorithm>

#include "attention/cuda/cudnn_sdpa_rows.h"
#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::attention_cuda::cudnn {
namespace {

struct Entry {
  std::shared_ptr<const SdpaMapping> mapping;  // held: the identity in the key stays unique
  QkvFormat format = QkvFormat::bshd;
  int64_t s_q = 0, h_q = 0;
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
  return tables;
}

}  // namespace

std::shared_ptr<const RowTables> row_tables(const std::shared_ptr<const SdpaMapping>& m, const AttentionProblem& p,
                                            const Device& device) {
  CPF_CHECK(m != nullptr, "cudnn row tables: no mapping");
  CPF_CHECK(m->reason.empty(), "cudnn row tables: the mapping is unsupported: ", m->reason);
  Cache& cache = thread_cache();
  void* stream = DeviceStream::current(device).handle();
  const auto hit = std::find_if(cache.entries.begin(), cache.entries.end(), [&](const Entry& e) {
    return e.mapping == m && e.format == p.format && e.s_q == p.s_q && e.h_q == p.h_q && e.device == device &&
           e.stream == stream;
  });
  if (hit != cache.entries.end()) {
    std::rotate(cache.entries.begin(), hit, hit + 1);
    ++cache.stats.hits;
    return cache.entries.front().tables;
  }
  std::shared_ptr<const RowTables> tables = build(*m, p, device);
  ++cache.stats.builds;
  cache.entries.insert(cache.entries.begin(), Entry{m, p.format, p.s_q, p.h_q, device, stream, tables});
  if (cache.entries.size() > kRowTablesEntries) cache.entries.pop_back();
  return tables;
}

RowTablesStats row_tables_stats() { return thread_cache().stats; }

}  // namespace cpf::attention_cuda::cudnn
