#pragma once
// thd calls as one cuDNN execution per group of entries of similar lengths (private to
// cpf_attention_cuda; used by attention/cuda/cudnn/fused_attention.cpp). attention/cuda/cudnn/document_groups.h chooses
// the groups; this file runs them (docs/cp.md, "Packed documents (thd): work balance").
//
// Every group is one execution over the call's q, k, v, o (dO, dQ, dK, dV) storage: ragged offsets
// address the packed rows, so an execution reads and writes only its own entries' rows. Each has its
// own plan (the key's b, s_q, s_kv and thd b strides are the group's), its own Stats (b_g, h_q, s_g),
// and in the backward its own row sums, fp32 dQ accumulator and workspace, so those buffers follow
// Σ b_g s_g instead of b x the longest entry. The groups' Stats live in one buffer, gathered into the
// packed (h_q, T) lse in one pass; the undefined-row fix-ups run once after the last group, over the
// whole call, as for one execution.
//
// Off by default: CPF_CUDNN_THD_GROUPS=1 groups, unset or 0 runs every thd call as one execution.
// Grouping measured within noise of one execution on the packed-documents benchmark (docs/cp.md and
// docs/attention.md give the figures), and each distinct group shape is a cuDNN plan of its own (slow to
// build), which training on batches whose documents change every step would pay again and again.
// Read once per process.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/document_groups.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "attention/cuda/cudnn/row_fixup_tables.h"
#include "attention/cuda/cudnn/row_fixups.h"
#include "attention/cuda/cudnn/tensor_placement.h"
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda::cudnn {

inline constexpr const char* kThdGroupsEnvVar = "CPF_CUDNN_THD_GROUPS";

// The call_rows grouping uses for a CPF_CUDNN_THD_GROUPS value: kGroupCallRows for "1", -1 (one
// execution) for nullptr, "" or "0"; anything else throws, naming the value.
int64_t parse_thd_groups(const char* value);
// The environment's choice (read once), or the test override.
int64_t thd_group_call_rows();
// Tests: group with `call_rows` (-1: one execution per call) until reset with nullopt. Throws for
// call_rows < -1. Not for use while attention calls run on other threads.
void set_thd_group_call_rows_for_testing(std::optional<int64_t> call_rows);

// Where each group's Stats (b_g, h_q, s_g), contiguous, lies in the call's one Stats buffer.
struct GroupLayout {
  std::vector<SdpaMapping> mappings;  // group_mapping of each group
  std::vector<int64_t> stats_offset;  // element offset of each group's Stats (a multiple of 128)
  int64_t stats_numel = 0;            // Σ b_g h_q s_g
};
GroupLayout group_layout(const SdpaMapping& m, const std::vector<SdpaGroup>& groups, int64_t h_q);

// Per element h * tokens + t of the packed lse (h_q, T), its element of the Stats buffer: the group's
// offset + (n h_q + h) s_g + j for its entry n's j-th query; tokens outside every entry read 0 (their
// rows are fixed up afterwards).
std::vector<int64_t> grouped_lse_index(const GroupLayout& layout, int64_t h_q, int64_t tokens);

// The packed lse (h_q, tokens) from the Stats buffer (1-d f32) in one gather by `index` (i64, from
// grouped_lse_index, on the buffer's device); a CPU buffer runs raw::index_select (the reference).
Tensor gathered_lse(const Tensor& stats, const Tensor& index, int64_t h_q, int64_t tokens);

// A call's groups with their device tables, made once per mapping, problem shape, device and stream.
struct GroupedTables {
  GroupLayout layout;
  RowRuns q_runs, kv_runs;            // the whole call's undefined rows (flag_runs)
  Tensor lse_index;                   // (h_q T) i64: grouped_lse_index
  std::vector<Tensor> stats_columns;  // per group (b_g s_g) i64: padded_to_packed of its mapping
  std::vector<RowTables> tables;      // per group: lengths and dense ragged offsets
};

// The groups of `m`'s call, from this thread's cache; nullptr when the call runs as one execution
// (not ragged, grouping off, or one group).
std::shared_ptr<const GroupedTables> grouped_tables(const std::shared_ptr<const SdpaMapping>& m,
                                                    const AttentionProblem& p, const Device& device);

// Grouped tables this thread built / served from its cache since it started (for tests).
struct GroupedTablesStats {
  uint64_t builds = 0, hits = 0;
};
GroupedTablesStats grouped_tables_stats();

// A call's groups with each group's key (the placed inputs' layouts) and plan.
struct GroupedRun {
  std::shared_ptr<const GroupedTables> tables;
  std::vector<SdpaGraphKey> keys;
  std::vector<const ExecutionPlan*> plans;
};
// nullopt when the call runs as one execution, or when cuDNN offers no engine for some group's key.
std::optional<GroupedRun> grouped_run(const std::shared_ptr<const SdpaMapping>& m, const Placed& in,
                                      const AttentionProblem& p, const Device& device, const PlanLookup& lookup);

// Forward: every group writes its rows of `out`; returns the packed lse (h_q, T) before the fix-ups.
// `sink`: the (dense f32) sink when in.key.sink, else undefined.
Tensor run_forward_groups(const GroupedRun& run, const Placed& in, const AttentionProblem& p, const Tensor& out,
                          const Tensor& sink, const Device& device);

// Backward: every group writes its rows of dq, dk, dv. `stats`: the packed lse (h_q, T) in f32 as cuDNN
// reads it (fully masked rows already +inf).
struct GroupedBackwardIo {
  Tensor out, dout, stats, dq, dk, dv;
};
void run_backward_groups(const GroupedRun& run, const Placed& in, const AttentionProblem& p,
                         const GroupedBackwardIo& io, const Device& device);

}  // namespace cpf::attention_cuda::cudnn
