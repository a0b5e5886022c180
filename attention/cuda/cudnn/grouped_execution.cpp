// thd calls as one cuDNN execution per group of similar lengths (attention/cuda/cudnn/grouped_execution.h).
#include "attention/cuda/cudnn/grouped_execution.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <string>

#include "attention/cuda/cudnn/fused_attention.h"
#include "attention/cuda/cudnn/row_fixups.h"
#include "attention/cuda/cudnn/variant_pack.h"
#include "framework/core/error.h"
#include "framework/core/logging.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/index.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"

namespace cpf::attention_cuda::cudnn {
namespace {

constexpr int64_t kNoOverride = std::numeric_limits<int64_t>::min();
std::atomic<int64_t> call_rows_override{kNoOverride};

// One cache entry: the parent mapping (held, so its address stays unique) and what the tables read.
struct Entry {
  std::shared_ptr<const SdpaMapping> mapping;
  QkvFormat format = QkvFormat::bshd;
  std::array<int64_t, 6> dims{};  // s_q, s_kv, h_q, h_kv, d_qk, d_v
  Device device;
  void* stream = nullptr;
  int64_t call_rows = 0;
  std::shared_ptr<const GroupedTables> tables;  // nullptr: one execution
};

// Per thread, like the row tables; a CP step's tiles are a handful of mappings.
constexpr size_t kGroupedEntries = 16;
thread_local GroupedTablesStats thread_stats;

std::array<int64_t, 6> dims_of(const AttentionProblem& p) { return {p.s_q, p.s_kv, p.h_q, p.h_kv, p.d_qk, p.d_v}; }

Tensor host_table(const std::vector<int64_t>& values, const Device& device) {
  return raw::to(from_vector(values, {static_cast<int64_t>(values.size())}), device);
}

std::shared_ptr<const GroupedTables> build(const SdpaMapping& m, const AttentionProblem& p, const Device& device,
                                           int64_t call_rows) {
  const std::vector<SdpaGroup> groups = group_entries_by_length(m, call_rows);
  if (groups.size() <= 1) return nullptr;
  auto t = std::make_shared<GroupedTables>();
  t->layout = group_layout(m, groups, p.h_q);
  t->q_runs = flag_runs(m.q_undefined, kMaxFillRuns);
  t->kv_runs = flag_runs(m.kv_undefined, kMaxFillRuns);
  t->lse_index = host_table(grouped_lse_index(t->layout, p.h_q, p.s_q), device);
  for (const SdpaMapping& g : t->layout.mappings) {
    t->stats_columns.push_back(host_table(padded_to_packed(g), device));
    t->tables.push_back(execution_tables(g, p, device));
  }
  int64_t rows = 0;
  for (const SdpaMapping& g : t->layout.mappings) rows += g.b * g.s_q;
  cpf::log(LogLevel::debug, "cuDNN thd call of ", m.b, " entries (b x s_q = ", m.b * m.s_q, " rows) runs as ",
           groups.size(), " executions of ", rows, " rows");
  return t;
}

}  // namespace

int64_t parse_thd_groups(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v == "1") return kGroupCallRows;
  CPF_CHECK(v.empty() || v == "0", kThdGroupsEnvVar, "='", v,
            "' is not 0 (one cuDNN execution per thd call, the default) or 1 (executions per group of similar "
            "lengths)");
  return -1;
}

int64_t thd_group_call_rows() {
  const int64_t forced = call_rows_override.load();
  if (forced != kNoOverride) return forced;
  static const int64_t from_env = parse_thd_groups(std::getenv(kThdGroupsEnvVar));
  return from_env;
}

void set_thd_group_call_rows_for_testing(std::optional<int64_t> call_rows) {
  CPF_CHECK(!call_rows || *call_rows >= -1, "set_thd_group_call_rows_for_testing: call_rows=", *call_rows,
            " must be >= -1 (-1: one execution per call)");
  call_rows_override.store(call_rows.value_or(kNoOverride));
}

GroupLayout group_layout(const SdpaMapping& m, const std::vector<SdpaGroup>& groups, int64_t h_q) {
  CPF_CHECK(h_q > 0, "group_layout: h_q=", h_q, " must be positive");
  GroupLayout layout;
  for (const SdpaGroup& g : groups) {
    layout.mappings.push_back(group_mapping(m, g));
    layout.stats_offset.push_back(layout.stats_numel);
    layout.stats_numel += layout.mappings.back().b * h_q * g.s_q;
  }
  return layout;
}

std::vector<int64_t> grouped_lse_index(const GroupLayout& layout, int64_t h_q, int64_t tokens) {
  std::vector<int64_t> index(static_cast<size_t>(h_q * tokens), 0);
  for (size_t g = 0; g < layout.mappings.size(); ++g) {
    const SdpaMapping& m = layout.mappings[g];
    for (int64_t n = 0; n < m.b; ++n) {
      const auto e = static_cast<size_t>(n);
      CPF_CHECK(m.q_token[e] >= 0 && m.q_token[e] + m.seq_len_q[e] <= tokens, "grouped_lse_index: entry ", n,
                " of group ", g, " covers tokens [", m.q_token[e], ", ", m.q_token[e] + m.seq_len_q[e],
                ") outside the call's ", tokens);
      for (int64_t h = 0; h < h_q; ++h) {
        const int64_t row = layout.stats_offset[g] + (n * h_q + h) * m.s_q;
        for (int64_t j = 0; j < m.seq_len_q[e]; ++j)
          index[static_cast<size_t>(h * tokens + m.q_token[e] + j)] = row + j;
      }
    }
  }
  return index;
}

Tensor gathered_lse(const Tensor& stats, const Tensor& index, int64_t h_q, int64_t tokens) {
  CPF_CHECK(stats.dim() == 1 && stats.is_contiguous() && index.dim() == 1 && index.dtype() == DType::i64 &&
                index.is_contiguous() && index.device() == stats.device() && index.size(0) == h_q * tokens,
            "gathered_lse: needs a contiguous 1-d Stats buffer and h_q * tokens = ", h_q * tokens,
            " i64 indices on its device, got Stats ", stats.shape(), " on ", stats.device(), ", index ", index.dtype(),
            " ", index.shape(), " on ", index.device());
  if (stats.device().is_cpu()) return raw::view(raw::index_select(stats, 0, index), {h_q, tokens});
  Tensor out = empty({h_q * tokens}, {.dtype = stats.dtype(), .device = stats.device()});
  device_kernel(stats.device(), &DeviceOps::gather, "cudnn attention (grouped lse)")(out, stats, 0, index, true);
  return raw::view(out, {h_q, tokens});
}

std::shared_ptr<const GroupedTables> grouped_tables(const std::shared_ptr<const SdpaMapping>& m,
                                                    const AttentionProblem& p, const Device& device) {
  CPF_CHECK(m != nullptr, "cudnn grouped tables: no mapping");
  const int64_t call_rows = thd_group_call_rows();
  if (call_rows < 0 || !m->ragged || !m->reason.empty() || m->b <= 1) return nullptr;
  thread_local std::vector<Entry> cache;  // most recently used first
  void* stream = DeviceStream::current(device).handle();
  const auto hit = std::find_if(cache.begin(), cache.end(), [&](const Entry& e) {
    return e.mapping == m && e.format == p.format && e.dims == dims_of(p) && e.device == device && e.stream == stream &&
           e.call_rows == call_rows;
  });
  if (hit != cache.end()) {
    std::rotate(cache.begin(), hit, hit + 1);
    ++thread_stats.hits;
    return cache.front().tables;
  }
  std::shared_ptr<const GroupedTables> tables = build(*m, p, device, call_rows);
  ++thread_stats.builds;
  cache.insert(cache.begin(), Entry{m, p.format, dims_of(p), device, stream, call_rows, tables});
  if (cache.size() > kGroupedEntries) cache.pop_back();
  return tables;
}

GroupedTablesStats grouped_tables_stats() { return thread_stats; }

std::optional<GroupedRun> grouped_run(const std::shared_ptr<const SdpaMapping>& m, const Placed& in,
                                      const AttentionProblem& p, const Device& device, const PlanLookup& lookup) {
  GroupedRun run;
  run.tables = grouped_tables(m, p, device);
  if (!run.tables) return std::nullopt;
  for (const SdpaMapping& g : run.tables->layout.mappings) {
    SdpaGraphKey key = in.key;  // the placed inputs' strides; b, s and the thd b strides are the group's
    key.b = g.b;
    key.s_q = g.s_q;
    key.s_kv = g.s_kv;
    set_layouts(key, p, g, in.layouts);
    const ExecutionPlan* plan = lookup(key);
    if (plan == nullptr) {  // the whole call's plan exists (it was probed): run that instead
      cpf::log(LogLevel::debug, "cuDNN thd groups: no engine for ", key.str(), "; the call runs as one execution");
      return std::nullopt;
    }
    run.keys.push_back(key);
    run.plans.push_back(plan);
  }
  return run;
}

Tensor run_forward_groups(const GroupedRun& run, const Placed& in, const AttentionProblem& p, const Tensor& out,
                          const Tensor& sink, const Device& device) {
  const GroupedTables& t = *run.tables;
  // Every group's (b_g, h_q, s_g) Stats, one after the other.
  const Tensor stats = empty({t.layout.stats_numel}, {.dtype = DType::f32, .device = device});
  for (size_t g = 0; g < run.keys.size(); ++g) {
    const SdpaMapping& m = t.layout.mappings[g];
    const SdpaGraphKey& key = run.keys[g];
    VariantPack pack;
    Scalars scalars;
    pack.add(kUidQ, in.q);
    pack.add(kUidK, in.k);
    pack.add(kUidV, in.v);
    pack.add(kUidO, out);
    pack.add(kUidStats,
             raw::as_strided(stats, {m.b, p.h_q, m.s_q}, {p.h_q * m.s_q, m.s_q, 1}, t.layout.stats_offset[g]));
    if (key.sink) pack.add(kUidSink, sink);
    add_common(pack, scalars, p, m, key, in.layouts, t.tables[g], device);
    const profile::Scope scope("attention/cudnn_forward_kernel", device);
    pack.run(*run.plans[g], device);
  }
  return gathered_lse(stats, t.lse_index, p.h_q, p.s_q);  // (h_q, T)
}

void run_backward_groups(const GroupedRun& run, const Placed& in, const AttentionProblem& p,
                         const GroupedBackwardIo& io, const Device& device) {
  const GroupedTables& t = *run.tables;
  const TensorOptions f32{.dtype = DType::f32, .device = device};
  for (size_t g = 0; g < run.keys.size(); ++g) {
    const SdpaMapping& m = t.layout.mappings[g];
    const SdpaGraphKey& key = run.keys[g];
    VariantPack pack;
    Scalars scalars;
    pack.add(kUidQ, in.q);
    pack.add(kUidK, in.k);
    pack.add(kUidV, in.v);
    pack.add(kUidO, io.out);
    pack.add(kUidDout, io.dout);
    pack.add(kUidStats, padded_stats(io.stats, t.stats_columns[g], m.b, m.s_q));  // (b_g, h_q, s_g)
    pack.add(kUidDq, io.dq);
    pack.add(kUidDk, io.dk);
    pack.add(kUidDv, io.dv);
    pack.add(kUidSoftmaxSum, empty({m.b, p.h_q, m.s_q}, f32));
    pack.add_host(kUidOne, &scalars.one);
    if (!key.deterministic) {                        // the group's own accumulator; cuDNN >= 9.6 zeroes it
                                                     // (attention/cuda/cudnn/fused_attention.cpp)
      const Shape accum{m.b, p.h_q, m.s_q, p.d_qk};  // (b_g, h_q, s_g, d_qk)
      pack.add(kUidDqAccum, runtime_version() >= 90600 ? empty(accum, f32) : zeros(accum, f32));
    }
    add_common(pack, scalars, p, m, key, in.layouts, t.tables[g], device);
    const profile::Scope scope("attention/cudnn_backward_kernel", device);
    pack.run(*run.plans[g], device);
  }
}

}  // namespace cpf::attention_cuda::cudnn
