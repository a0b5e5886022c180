// cuDNN fused attention: checks, the plan lookup (plan_cache.h), and forward/backward execution with the
// fix-ups that turn cuDNN's results into the attention_op.h contract (see attention/cuda/cudnn/fused_attention.h).
#include "attention/cuda/cudnn/fused_attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "attention/cuda/cudnn/backend_api.h"
#include "attention/cuda/cudnn/graph_building.h"
#include "attention/cuda/cudnn/grouped_execution.h"
#include "attention/cuda/cudnn/plan_cache.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "attention/cuda/cudnn/problem_mapping_cache.h"
#include "attention/cuda/cudnn/row_fixup_tables.h"
#include "attention/cuda/cudnn/row_fixups.h"
#include "attention/cuda/cudnn/strided_layout.h"
#include "attention/cuda/cudnn/tensor_placement.h"
#include "attention/cuda/cudnn/variant_pack.h"
#include "attention/cuda/device_tables.h"
#include "framework/core/logging.h"
#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/index.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"

namespace cpf::attention_cuda::cudnn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The cuDNN type of a project dtype, or 0 when cuDNN's fused attention does not take it. f16 maps to
// CUDNN_DATA_HALF the day the project has an f16 DType; the graphs are parametric in it already.
int io_data_type(DType dtype) { return dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : 0; }

// One call after the checks: the mapping onto cuDNN (shared with the mapping cache, never copied), the
// plan key and the (dense) layouts it declares.
struct Prepared {
  std::string reason;
  std::shared_ptr<const SdpaMapping> mapping;
  SdpaGraphKey key;
  Layouts layouts;
};

std::string version_reason(int64_t version, const SdpaMapping& m) {
  if (version == 0) return "cuDNN could not be loaded";
  if (version < 90600) {
    return "cuDNN " + std::to_string(version) +
           " is older than 9.6.0 (needed for sliding windows, bottom-right "
           "masks and packed thd); install cuDNN 9.19 or use attention.backend: unfused";
  }
  if (version == 91000 || version == 91001) {
    return "cuDNN 9.10.0/9.10.1 are known to give wrong bf16/f16 attention results; use 9.10.2+ or "
           "attention.backend: unfused";
  }
  if (version < 91000 && ((m.right_bound && m.right < 0) || (m.left_bound && m.left <= 0))) {
    // Verified on 9.19 (cudnn_test's fully masked rows); the frontend refuses such bounds before 9.10.
    return "cuDNN " + std::to_string(version) + " takes no negative diagonal bounds (right " + std::to_string(m.right) +
           ", left " + std::to_string(m.left) +
           "); use cuDNN 9.10.2+ or "
           "attention.backend: unfused";
  }
  if (version == 91400 && m.left_bound) {
    return "cuDNN 9.14.0 is known to give wrong sliding-window results for s_kv > 1024; use 9.14.1+ or "
           "attention.backend: unfused";
  }
  return "";
}

Prepared prepare(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse) {
  Prepared r;
  auto fail = [&](std::string reason) {
    r.reason = std::move(reason);
    return r;
  };
  if (io_data_type(dtype) == 0) return fail(dtype_name(dtype) + " inputs (cuDNN's fused attention takes bf16)");
  if (backward && has_dlse) return fail("dlse is set (cuDNN's backward has no input for a gradient of the lse)");
  for (const auto& [name, d] : {std::pair{"head_dim_qk", p.d_qk}, std::pair{"head_dim_v", p.d_v}}) {
    if (d % 8 != 0) return fail(std::string(name) + " " + std::to_string(d) + " is not a multiple of 8");
    if (d > 256) return fail(std::string(name) + " " + std::to_string(d) + " is above 256");
  }
  // TransformerEngine's Hopper gate: differing head dims both >= 128 train correctly only as 192/128.
  if (backward && p.d_qk != p.d_v && std::min(p.d_qk, p.d_v) >= 128 && !(p.d_qk == 192 && p.d_v == 128)) {
    return fail("head dims " + std::to_string(p.d_qk) + "/" + std::to_string(p.d_v) +
                " (both >= 128 and different) are only supported as 192/128 in cuDNN's backward");
  }
  if (backward && p.s_q == 1 && p.s_kv == 1) return fail("s_q = s_kv = 1 (cuDNN's backward refuses it)");
  if (p.h_kv <= 0 || p.h_q % p.h_kv != 0) return fail("the query heads are not a multiple of the kv heads");
  r.mapping = cached_mapping(p);  // every layer maps the same tiles: one mapping per tile and thread
  if (!r.mapping->reason.empty()) return fail(r.mapping->reason);
  if (std::string v = version_reason(runtime_version(), *r.mapping); !v.empty()) return fail(v);

  const SdpaMapping& m = *r.mapping;
  SdpaGraphKey& k = r.key;
  k.backward = backward;
  k.io_type = io_data_type(dtype);
  k.b = m.b;
  k.h_q = p.h_q;
  k.h_kv = p.h_kv;
  k.s_q = m.s_q;
  k.s_kv = m.s_kv;
  k.d_qk = p.d_qk;
  k.d_v = p.d_v;
  k.padding = m.padding;
  k.ragged = m.ragged;
  r.layouts = dense_layouts(p);
  set_layouts(k, p, m, r.layouts);
  k.right_bound = m.right_bound;
  k.right_shift = m.right_bound && m.right != 0;
  k.left_bound = m.left_bound;
  k.bottom_right = m.bottom_right;
  k.deterministic = backward && p.config.deterministic;
  // The sink joins cuDNN's forward graph from 9.13 on. A row that sees no key would get lse = sink
  // there, where the contract keeps -inf (attention_sink.h): such calls run the plain graph and
  // raw::attention_forward rescales the rows instead, as it does for every other kernel.
  k.sink = !backward && p.sink.defined() && !m.any_fully_masked_row && runtime_version() >= 91300;
  return r;
}

// The plan for a prepared call, or a cpf::Error naming why there is none.
const ExecutionPlan& plan_for(const Prepared& prepared, const char* op) {
  CPF_CHECK(prepared.reason.empty(), op, " (cudnn): ", prepared.reason);
  const CachedPlan& entry = cached_plan(prepared.key);
  CPF_CHECK(entry.plan != nullptr, op, " (cudnn): ", entry.failure);
  return *entry.plan;
}

// A sink graph for which cuDNN offers no engine falls back to the plain graph (the rows are then
// rescaled after the kernel, attention_sink.h): the sink never makes a call unsupported.
void without_unbuildable_sink(Prepared& prepared) {
  if (prepared.reason.empty() && prepared.key.sink && !cached_plan(prepared.key).plan) prepared.key.sink = false;
}

Prepared prepare_on(const AttentionProblem& p, const Tensor& q, bool backward, bool has_dlse) {
  Prepared prepared = prepare(p, q.dtype(), backward, has_dlse);
  prepared.key.device = q.device().index;
  without_unbuildable_sink(prepared);
  return prepared;
}

}  // namespace

int64_t runtime_version() {
  static const int64_t version = static_cast<int64_t>(cudnnGetVersion());
  return version;
}

// A prepared call: the checks' result, the mapping, the key, and the plan when there is one.
struct PreparedCall {
  Prepared prepared;
  std::shared_ptr<ExecutionPlan> plan;  // null when prepared.reason is set
};

std::shared_ptr<const PreparedCall> prepare_call(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse) {
  auto call = std::make_shared<PreparedCall>();
  Prepared& prepared = call->prepared;
  prepared = prepare(p, dtype, backward, has_dlse);
  if (!prepared.reason.empty()) return call;
  if (cuda::device_count() == 0) {
    prepared.reason = "no CUDA device is visible";
    return call;
  }
  // The problem does not name its device: probe on the thread's current one (the dispatcher makes q's
  // device current; forward/backward prepare again for a call made for another device).
  int device = 0;
  CPF_CUDA_CHECK(cudaGetDevice(&device));
  prepared.key.device = device;
  without_unbuildable_sink(prepared);
  const CachedPlan& entry = cached_plan(prepared.key);
  if (entry.plan) {
    call->plan = entry.plan;
  } else {
    prepared.reason = entry.failure;
  }
  return call;
}

const std::string& prepared_reason(const PreparedCall& call) { return call.prepared.reason; }

std::string unsupported_reason(const AttentionProblem& p, DType dtype, bool backward, bool has_dlse) {
  return prepare_call(p, dtype, backward, has_dlse)->prepared.reason;
}

namespace {

// The inputs as cuDNN reads them (attention/cuda/cudnn/tensor_placement.h); plans for strided layouts from this
// thread's cache.
const ExecutionPlan* lookup_plan(const SdpaGraphKey& key) { return cached_plan(key).plan.get(); }

Placed placed(const Prepared& prepared, const ExecutionPlan& plan, const AttentionProblem& p, const Tensor& q,
              const Tensor& k, const Tensor& v) {
  return place_inputs(prepared.key, prepared.layouts, *prepared.mapping, plan, p, q, k, v, lookup_plan);
}

// One execution over every entry: writes out, returns the lse in the call's layout before the fix-ups.
Tensor forward_once(const Prepared& prepared, const Placed& in, const RowTables& tables, const AttentionProblem& p,
                    const Tensor& out, const Tensor& sink, const Device& device) {
  const SdpaMapping& m = *prepared.mapping;
  // cuDNN's Stats is (b, h_q, s_q, 1): exactly the bshd/sbhd lse; thd pads it per sequence.
  Tensor stats = empty({m.b, p.h_q, m.s_q}, {.dtype = DType::f32, .device = device});
  VariantPack pack;
  Scalars scalars;
  pack.add(kUidQ, in.q);
  pack.add(kUidK, in.k);
  pack.add(kUidV, in.v);
  pack.add(kUidO, out);
  pack.add(kUidStats, stats);
  if (in.key.sink) pack.add(kUidSink, sink);
  add_common(pack, scalars, p, m, in.key, in.layouts, tables, device);
  {
    // The kernel alone (its GPU time), apart from the host work of the call around it.
    const profile::Scope scope("attention/cudnn_forward_kernel", device);
    pack.run(*in.plan, device);
  }
  const profile::Scope host("attention/cudnn_fixups", Device::cpu());
  if (m.ragged) return packed_lse(stats, tables.lse_index);  // (b, h_q, s) -> (h_q, T), one gather
  return stats;
}

raw::AttentionForward run_forward(const Prepared& prepared, const ExecutionPlan& plan, const AttentionProblem& p,
                                  const Tensor& q, const Tensor& k, const Tensor& v) {
  const SdpaMapping& m = *prepared.mapping;
  const Device device = q.device();
  // Host time only (no GPU events): the inputs, buffers and tables of the call, then the fix-ups.
  std::optional<profile::Scope> host(std::in_place, "attention/cudnn_pack", Device::cpu());
  const Placed in = placed(prepared, plan, p, q, k, v);
  Tensor out = empty(p.out_shape(), {.dtype = q.dtype(), .device = device});
  const Tensor sink = in.key.sink ? dense(p.sink, DType::f32) : Tensor();
  // thd calls of entries of very different lengths: one execution per group (attention/cuda/cudnn/grouped_execution.h).
  const std::optional<GroupedRun> groups = grouped_run(prepared.mapping, in, p, device, lookup_plan);
  std::shared_ptr<const RowTables> tables;
  if (!groups) tables = row_tables(prepared.mapping, p, device);
  host.reset();
  Tensor lse = groups ? run_forward_groups(*groups, in, p, out, sink, device)
                      : forward_once(prepared, in, *tables, p, out, sink, device);

  host.emplace("attention/cudnn_fixups", Device::cpu());
  if (!m.q_undefined.empty()) {  // once over the whole call, after the last group
    const RowRuns& q_runs = groups ? groups->tables->q_runs : tables->q_runs;
    out = fill_token_rows(p, out, m.q_undefined, q_runs, p.s_q, 0.0);
    lse = fill_lse_rows(p, lse, m.q_undefined, q_runs, -kInf);
  }
  return {out, lse, {}, in.key.sink};
}

// One execution over every entry, writing dq, dk, dv. `stats`: the lse in the call's layout, f32.
void backward_once(const Prepared& prepared, const Placed& in, const RowTables& tables, const AttentionProblem& p,
                   const GroupedBackwardIo& io, const Device& device) {
  const SdpaMapping& m = *prepared.mapping;
  const Tensor stats = m.ragged ? padded_stats(io.stats, tables.stats_columns, m.b, m.s_q)  // (h_q, T) -> (b, h_q, s)
                                : io.stats;
  // rowsum(dO * O) and (non-deterministic) the fp32 dQ accumulator come from the caching allocator.
  // cuDNN zeroes the accumulator itself from 9.6 (its frontend stopped doing it then), so it is only
  // zeroed here for older libraries: b h s d f32 a call (0.36 ms a GPT-2 step; 10x the tokens for
  // packed documents run as one execution, whose s is the longest document's).
  const Tensor softmax_sum = empty({m.b, p.h_q, m.s_q}, {.dtype = DType::f32, .device = device});
  VariantPack pack;
  Scalars scalars;
  pack.add(kUidQ, in.q);
  pack.add(kUidK, in.k);
  pack.add(kUidV, in.v);
  pack.add(kUidO, io.out);
  pack.add(kUidDout, io.dout);
  pack.add(kUidStats, stats);
  pack.add(kUidDq, io.dq);
  pack.add(kUidDk, io.dk);
  pack.add(kUidDv, io.dv);
  pack.add(kUidSoftmaxSum, softmax_sum);
  pack.add_host(kUidOne, &scalars.one);
  if (!in.key.deterministic) {
    const Shape accum{m.b, p.h_q, m.s_q, p.d_qk};  // (b, h_q, s_q, d_qk)
    const TensorOptions f32{.dtype = DType::f32, .device = device};
    pack.add(kUidDqAccum, runtime_version() >= 90600 ? empty(accum, f32) : zeros(accum, f32));
  }
  add_common(pack, scalars, p, m, in.key, in.layouts, tables, device);
  const profile::Scope scope("attention/cudnn_backward_kernel", device);
  pack.run(*in.plan, device);
}

raw::AttentionGrads run_backward(const Prepared& prepared, const ExecutionPlan& plan, const AttentionProblem& p,
                                 const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse) {
  const SdpaMapping& m = *prepared.mapping;
  const Device device = q.device();
  std::optional<profile::Scope> host(std::in_place, "attention/cudnn_pack", Device::cpu());  // host time only
  const Placed in = placed(prepared, plan, p, q, k, v);
  GroupedBackwardIo io{dense(out, q.dtype()),
                       dense(dout, q.dtype()),
                       raw::contiguous(raw::to(lse, DType::f32)),
                       Tensor(),
                       Tensor(),
                       Tensor()};
  // Rows that see no key carry lse = -inf; cuDNN computes exp(s - lse) and would get NaN from
  // -inf - -inf under the padding mask. +inf gives exp(-inf) = 0 for every column instead.
  if (m.any_fully_masked_row) {
    io.stats = raw::masked_fill(io.stats, raw::compare(raw::CompareOp::eq, io.stats, -kInf), kInf);
  }
  // Packed (in.grads): views of one (tokens, (h_q + 2 h_kv) d) buffer, so split's backward needs no cat.
  io.dq = in.grads ? (*in.grads)[0] : empty(q.shape(), {.dtype = q.dtype(), .device = device});
  io.dk = in.grads ? (*in.grads)[1] : empty(k.shape(), {.dtype = k.dtype(), .device = device});
  io.dv = in.grads ? (*in.grads)[2] : empty(v.shape(), {.dtype = v.dtype(), .device = device});
  const std::optional<GroupedRun> groups = grouped_run(prepared.mapping, in, p, device, lookup_plan);
  std::shared_ptr<const RowTables> tables;
  if (!groups) tables = row_tables(prepared.mapping, p, device);
  host.reset();
  if (groups) {
    run_backward_groups(*groups, in, p, io, device);
  } else {
    backward_once(prepared, in, *tables, p, io, device);
  }

  host.emplace("attention/cudnn_fixups", Device::cpu());  // once over the whole call, after the last group
  const GroupedTables* g = groups ? groups->tables.get() : nullptr;
  if (!m.q_undefined.empty())
    io.dq = fill_token_rows(p, io.dq, m.q_undefined, g ? g->q_runs : tables->q_runs, p.s_q, 0.0);
  if (!m.kv_undefined.empty()) {
    const RowRuns& kv_runs = g ? g->kv_runs : tables->kv_runs;
    io.dk = fill_token_rows(p, io.dk, m.kv_undefined, kv_runs, p.s_kv, 0.0);
    io.dv = fill_token_rows(p, io.dv, m.kv_undefined, kv_runs, p.s_kv, 0.0);
  }
  return {io.dq, io.dk, io.dv, {}, {}};
}

}  // namespace

raw::AttentionForward forward(const AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v) {
  const Prepared prepared = prepare_on(p, q, /*backward=*/false, /*has_dlse=*/false);
  return run_forward(prepared, plan_for(prepared, "attention_forward"), p, q, k, v);
}

raw::AttentionGrads backward(const AttentionProblem& p, const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse) {
  const Prepared prepared = prepare_on(p, q, /*backward=*/true, /*has_dlse=*/false);
  return run_backward(prepared, plan_for(prepared, "attention_backward"), p, dout, q, k, v, out, lse);
}

// A call made for q's device with a plan runs as it is; anything else goes the long way, which throws
// the reason when there is one.
raw::AttentionForward forward(const PreparedCall& call, const AttentionProblem& p, const Tensor& q, const Tensor& k,
                              const Tensor& v) {
  CPF_CHECK(!call.plan || !call.prepared.key.backward,
            "attention_forward (cudnn): the call was prepared for a backward");
  if (!call.plan || call.prepared.key.device != q.device().index) return forward(p, q, k, v);
  return run_forward(call.prepared, *call.plan, p, q, k, v);
}

raw::AttentionGrads backward(const PreparedCall& call, const AttentionProblem& p, const Tensor& dout, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  CPF_CHECK(!call.plan || call.prepared.key.backward,
            "attention_backward (cudnn): the call was prepared for a forward");
  if (!call.plan || call.prepared.key.device != q.device().index) return backward(p, dout, q, k, v, out, lse);
  return run_backward(call.prepared, *call.plan, p, dout, q, k, v, out, lse);
}

}  // namespace cpf::attention_cuda::cudnn
