#pragma once
// gpu_cp_bench --thd-plan: the attention calls the packed-documents case (cp_bench_thd.h) makes, per
// strategy and rank, as cuDNN would see them, without a GPU (map_to_cudnn is host logic). For each
// call: the query tokens, the cuDNN batch (b: the documents that have work), the padded s_q / s_kv
// (the longest entry, rounded up to 128), how many rows the (b, h, s) buffers hold against the real
// query tokens (cuDNN's Stats, the backward's fp32 dQ accumulator and row sums, and the grid are sized
// b x s_q, not by the tokens), the same for the executions cuDNN runs per group of similar lengths
// (attention/cuda/cudnn/grouped_execution.h; one with CPF_CUDNN_THD_GROUPS=0), the runs of undefined
// rows the fix-ups fill, the backend (or cuDNN's reason against it) and the host time of the call's
// tables (pair_sequence_info, check_attention_inputs, map_to_cudnn, the lse index tables; then the call
// again with its mapping cached, as every later layer makes it) on the machine that runs it.
// Strategies covered: p2p (one call per visible ring step), all_gather (own-keys tile, then one call per
// query chunk on the others' keys) and a2a (one call over the whole batch with H/P heads).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cp/layout.h"
#include "attention/cp/layout_cache.h"
#include "attention/cuda/cudnn/document_groups.h"
#include "attention/cuda/cudnn/grouped_execution.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "attention/cuda/cudnn/problem_mapping_cache.h"
#include "attention/cuda/cudnn/row_fixups.h"
#include "benchmarks/gpu/cp_bench_thd.h"

namespace cpf::bench::thd {

struct PlannedCall {
  std::string what;  // "step 1 (kv of rank 0)", "own keys", "others, chunk 0", "whole batch"
  int64_t q_tokens = 0, heads = 0;
  attention_cuda::cudnn::SdpaMapping mapping;
  size_t q_runs = 0, kv_runs = 0;  // runs of undefined rows (fix-ups)
  // Host ms of the call's tables: pair_sequence_info, check_attention_inputs, map_to_cudnn, lse index tables.
  double pair_ms = 0, problem_ms = 0, mapping_ms = 0, tables_ms = 0;
  // The same call again with the mapping cached (what every later layer pays): pair, check, cache lookup.
  double steady_ms = 0;
};

// The call for `info` on `q_tokens` queries and `kv_tokens` keys with `heads` query (= kv) heads.
inline PlannedCall plan_call(std::string what, const SequenceInfo& info, int64_t q_tokens, int64_t kv_tokens,
                             int64_t heads, double pair_ms) {
  using namespace attention_cuda::cudnn;
  PlannedCall c;
  c.what = std::move(what);
  c.q_tokens = q_tokens;
  c.heads = heads;
  c.pair_ms = pair_ms;
  auto t0 = Clock::now();
  // One head of the right head dim: the mapping depends on the sequences and positions only.
  const Tensor q = empty({q_tokens, 1, kHeadDim}, {.dtype = DType::bf16});
  const Tensor k = empty({kv_tokens, 1, kHeadDim}, {.dtype = DType::bf16});
  const AttentionProblem p = check_attention_inputs(q, k, k, spec(), info, {});
  c.problem_ms = seconds_since(t0) * 1e3;
  t0 = Clock::now();
  c.mapping = map_to_cudnn(p);
  c.mapping_ms = seconds_since(t0) * 1e3;
  t0 = Clock::now();
  if (c.mapping.reason.empty() && c.mapping.ragged) {
    (void)packed_to_padded(p, c.mapping);  // forward lse gather
    (void)padded_to_packed(c.mapping);     // backward lse scatter
  }
  c.tables_ms = seconds_since(t0) * 1e3;
  (void)cached_mapping(p);  // fills this thread's cache
  t0 = Clock::now();
  (void)cached_mapping(check_attention_inputs(q, k, k, spec(), info, {}));
  c.steady_ms = pair_ms + seconds_since(t0) * 1e3;
  c.q_runs = flag_runs(c.mapping.q_undefined, c.mapping.q_undefined.size()).size();
  c.kv_runs = flag_runs(c.mapping.kv_undefined, c.mapping.kv_undefined.size()).size();
  return c;
}

template <class F>
SequenceInfo timed(F&& make, double& ms) {
  const auto t0 = Clock::now();
  SequenceInfo info = make();
  ms = seconds_since(t0) * 1e3;
  return info;
}

inline std::vector<PlannedCall> plan_p2p(const cp::GlobalSequences& g, int ranks, int rank) {
  const auto layouts = cp::cached_rank_layouts(g, ranks);
  std::vector<PlannedCall> calls;
  for (int step = 0; step < ranks; ++step) {
    const int src = (rank - step + ranks) % ranks;
    const auto& q = (*layouts)[static_cast<size_t>(rank)];
    const auto& kv = (*layouts)[static_cast<size_t>(src)];
    if (!cp::any_visible(q, kv, effective_window(spec()))) continue;
    double ms = 0;
    const SequenceInfo info = timed([&] { return cp::pair_sequence_info(q, kv); }, ms);
    calls.push_back(plan_call("step " + std::to_string(step) + " (kv of rank " + std::to_string(src) + ")", info,
                              q.tokens(), kv.tokens(), kHeads, ms));
  }
  return calls;
}

inline std::vector<PlannedCall> plan_all_gather(const cp::GlobalSequences& g, int ranks, int rank) {
  const auto own = cp::cached_group_layout(g, ranks, {rank});
  std::vector<int> others;
  for (int r = 0; r < ranks; ++r) {
    if (r != rank) others.push_back(r);
  }
  const auto rest = cp::cached_group_layout(g, ranks, others);
  std::vector<PlannedCall> calls;
  double ms = 0;
  const SequenceInfo diag = timed([&] { return cp::pair_sequence_info(*own, *own); }, ms);
  calls.push_back(plan_call("own keys", diag, own->tokens(), own->tokens(), kHeads, ms));
  const SequenceInfo pair = timed([&] { return cp::pair_sequence_info(*own, *rest); }, ms);
  const auto parts = cp::split_query_runs(pair, own->slot_index);
  for (size_t i = 0; i < parts.size(); ++i) {
    calls.push_back(
        plan_call("others, chunk " + std::to_string(i), parts[i], own->tokens(), rest->tokens(), kHeads, ms));
  }
  return calls;
}

inline std::vector<PlannedCall> plan_a2a(const cp::GlobalSequences& g, int ranks) {
  std::vector<int> members;
  for (int r = 0; r < ranks; ++r) members.push_back(r);
  const auto whole = cp::cached_group_layout(g, ranks, members);
  double ms = 0;
  const SequenceInfo info = timed([&] { return cp::pair_sequence_info(*whole, *whole); }, ms);
  return {plan_call("whole batch", info, whole->tokens(), whole->tokens(), kHeads / ranks, ms)};
}

constexpr const char* kPlanRow =
    "%-10s | %-4s | %-22s | %-8s | %-4s | %-6s | %-6s | %-8s | %-9s | %-19s | %-6s | %-7s | %-32s | %s\n";

inline void print_calls(const char* strategy, int rank, const std::vector<PlannedCall>& calls) {
  for (const PlannedCall& c : calls) {
    const auto& m = c.mapping;
    const double rows = static_cast<double>(m.b * m.s_q);
    // The backward's fp32 dQ accumulator, (b, h, s_q, d), zeroed every call.
    const double accum_gib = rows * static_cast<double>(c.heads * kHeadDim * 4) / (1024.0 * 1024 * 1024);
    // How the call runs (attention/cuda/cudnn/grouped_execution.h): one execution per group of similar lengths, or one
    // execution with CPF_CUDNN_THD_GROUPS=0; rows, dQ accumulator, executions.
    const int64_t call_rows = attention_cuda::cudnn::thd_group_call_rows();
    const auto groups =
        call_rows < 0 ? std::vector<attention_cuda::cudnn::SdpaGroup>{{std::vector<int64_t>(static_cast<size_t>(m.b)),
                                                                       m.s_q, m.s_kv}}
                      : attention_cuda::cudnn::group_entries_by_length(m, call_rows);
    double grouped_rows = 0;
    for (const auto& group : groups)
      grouped_rows += static_cast<double>(group.entries.size()) * static_cast<double>(group.s_q);
    char host[64], ratio[32], accum[32], grouped[48];
    std::snprintf(grouped, sizeof grouped, "%.2f / %.2f / %zu", grouped_rows / static_cast<double>(c.q_tokens),
                  accum_gib * grouped_rows / rows, groups.size());
    std::snprintf(host, sizeof host, "%.2f/%.2f/%.2f/%.2f, cached %.2f", c.pair_ms, c.problem_ms, c.mapping_ms,
                  c.tables_ms, c.steady_ms);
    std::snprintf(ratio, sizeof ratio, "%.2f", rows / static_cast<double>(c.q_tokens));
    std::snprintf(accum, sizeof accum, "%.2f", accum_gib);
    const std::string backend = m.reason == "no query sees a key" ? "none (sees no key: not called)"
                                : m.reason.empty()                ? "cudnn"
                                                                  : "unfused (cuDNN: " + m.reason.substr(0, 80) + ")";
    std::printf(kPlanRow, strategy, std::to_string(rank).c_str(), c.what.c_str(), std::to_string(c.q_tokens).c_str(),
                std::to_string(m.b).c_str(), std::to_string(m.s_q).c_str(), std::to_string(m.s_kv).c_str(), ratio,
                accum, grouped, std::to_string(c.q_runs).c_str(), std::to_string(c.kv_runs).c_str(), host,
                backend.c_str());
  }
}

// Prints the plan of every strategy (p2p, all_gather, a2a) and rank, and the single-GPU call; returns 0.
// ranks < 2 (no GPU visible) plans 4; tokens_per_gpu <= 0 plans the default 65536.
inline int print_plan(int ranks, int64_t tokens_per_gpu) {
  ranks = ranks >= 2 ? ranks : 4;
  tokens_per_gpu = tokens_per_gpu > 0 ? tokens_per_gpu : 65536;
  const Batch b = make_batch(ranks, tokens_per_gpu);
  cp::GlobalSequences g;
  g.cu_seqlens = b.cu;
  g.cu_seqlens_padded = b.cu_padded;
  std::printf(
      "\nCP packed documents, call plan (no GPU used): %lld documents, %lld real tokens, %d ranks; rows/tok = b x "
      "s_q "
      "of cuDNN's (b, h, s) buffers over the call's query tokens; dQacc = the backward's fp32 dQ accumulator at "
      "d=%lld; grouped = how cuDNN runs it (attention/cuda/cudnn/grouped_execution.h; CPF_CUDNN_THD_GROUPS=0: one "
      "execution): rows/tok, "
      "dQacc GiB, executions; runs = "
      "undefined q / kv row runs filled after the call\n",
      static_cast<long long>(b.documents), static_cast<long long>(b.cu.back()), ranks,
      static_cast<long long>(kHeadDim));
  std::printf(kPlanRow, "strategy", "rank", "call", "q tokens", "b", "s_q", "s_kv", "rows/tok", "dQacc GiB",
              "grouped: rows dQ n", "q runs", "kv runs", "host ms pair/chk/map/tab, cached", "backend");
  double ms = 0;
  const SequenceInfo whole = timed([&] { return SequenceInfo::from_cu_seqlens(b.cu, b.cu_padded); }, ms);
  print_calls("1 GPU", 0, {plan_call("whole batch", whole, b.cu_padded.back(), b.cu_padded.back(), kHeads, ms)});
  for (int r = 0; r < ranks; ++r) print_calls("p2p", r, plan_p2p(g, ranks, r));
  for (int r = 0; r < ranks; ++r) print_calls("all_gather", r, plan_all_gather(g, ranks, r));
  print_calls("a2a", 0, plan_a2a(g, ranks));
  std::fflush(stdout);
  return 0;
}

}  // namespace cpf::bench::thd
