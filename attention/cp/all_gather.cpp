// all_gather: gather K and V from the whole CP group, attend the local queries to them.
//
// Sharding as in p2p.cpp (rank r holds chunks r and 2P-1-r). P = 2, S = 8, c = 2, causal:
//
//     gathered KV (rank order)   [C0 C3 | C1 C2]   ->  sequence order  C0 C1 C2 C3
//
//     rank 0 queries:          keys  C0 C1 C2 C3           rank 1 queries:   keys  C0 C1 C2 C3
//                         C0         \  .  .  .                          C1        x  \  .  .
//                         C3         x  x  x  \                          C2        x  x  \  .
//
// Each local query chunk sees a prefix of the sequence (bottom-right aligned under causal; a
// sliding window trims the start). The two chunks see their keys along two different diagonals, so
// the queries go in one call per chunk (split_query_runs; a mask-free call stays one), each a single
// band that cuDNN runs fused; tiles outside the mask are skipped, so rank 0's C0 costs one diagonal
// tile. The calls cover disjoint query rows: their (out, lse) merge exactly, their gradients add.
//
// Backward gathers K and V again (not kept between passes, to save memory), computes dQ and the
// dK/dV of every gathered token, and reduce-scatters dK/dV back to their owners.
#include "attention/cp/lse_merge.h"
#include "attention/cp/strategy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"

#include <optional>

namespace cpf::cp {
namespace {

std::vector<int> all_members(const CpContext& ctx) {
  std::vector<int> members;
  for (int r = 0; r < static_cast<int>(ctx.cp_size); ++r) members.push_back(r);
  return members;
}

// K and V of every rank in sequence-major order of the whole group.
// With MLA latent communication (ctx.latent) the latent is gathered and expanded here; `latent_out`
// then receives the gathered latent (the backward projects dK/dV through it).
std::pair<Tensor, Tensor> gather_kv(const CpContext& ctx, const GroupLayout& full, const Tensor& k, const Tensor& v,
                                    Tensor* latent_out = nullptr) {
  // (T, Hkv, Dqk + Dv): one collective for both; or the latent (T, 1, r + rope).
  const Tensor kv = ctx.latent ? k : raw::cat({k, v}, -1);
  ctx.count_sent(kv, ctx.cp_size - 1);
  const Tensor gathered = to_sequence_major(ctx.groups.group->all_gather(kv, 0), full);
  if (ctx.latent) {
    if (latent_out) *latent_out = gathered;
    return ctx.latent->expand(gathered);
  }
  const int64_t d_qk = k.size(-1), d_v = v.size(-1);
  return {raw::contiguous(raw::narrow(gathered, -1, 0, d_qk)), raw::contiguous(raw::narrow(gathered, -1, d_qk, d_v))};
}

// The local queries against the gathered sequence: one call per query chunk (see the file comment).
std::vector<SequenceInfo> query_parts(const CpContext& ctx, const GroupLayout& full) {
  const GroupLayout own = ctx.own_layout();
  const SequenceInfo pair = pair_sequence_info(own, full);
  const AttentionWindow window = effective_window(ctx.spec);
  if (window.left < 0 && window.right < 0) return {pair};  // no mask: positions do not matter
  // Split by chunk (runs of slot indices), not by runs of positions: explicit positions with gaps
  // would make every query its own run.
  return split_query_runs(pair, own.slot_index);
}

}  // namespace

CpForward all_gather_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  const GroupLayout full = make_group_layout(ctx.global, ctx.cp_size, all_members(ctx));
  const auto [k_all, v_all] = gather_kv(ctx, full, k, v);
  const std::vector<SequenceInfo> parts = query_parts(ctx, full);
  std::optional<PartialMerge> merge;
  raw::AttentionForward whole;
  for (const SequenceInfo& part : parts) {
    auto result = raw::attention_forward(q, k_all, v_all, ctx.spec, part, ctx.groups.kernel_config);
    ctx.stats->forward_tiles.full += result.tiles.full;
    ctx.stats->forward_tiles.partial += result.tiles.partial;
    ctx.stats->forward_tiles.skipped += result.tiles.skipped;
    if (parts.size() == 1) {
      whole = std::move(result);
      break;
    }
    if (!merge) merge.emplace(q.size(0), q.size(1), ctx.value_dim(v), q.dtype(), q.device());
    merge->add(result.out, result.lse);
  }
  if (!merge) return with_sink(ctx, {whole.out, whole.lse, {}});
  return with_sink(ctx, {merge->out(q.dtype()), merge->lse(), {}});
}

CpGrads all_gather_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                            const Tensor& k, const Tensor& v, const CpSaved& saved) {
  const GroupLayout full = make_group_layout(ctx.global, ctx.cp_size, all_members(ctx));
  Tensor latent_all;  // MLA latent communication: the gathered latent
  const auto [k_all, v_all] = gather_kv(ctx, full, k, v, &latent_all);
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor dq, dkv_all;  // sums over the query parts, in the accumulation dtype
  for (const SequenceInfo& part : query_parts(ctx, full)) {
    const auto grads = raw::attention_backward(dout, dlse, q, k_all, v_all, saved.out, saved.lse, ctx.spec, part,
                                               ctx.groups.kernel_config);
    ctx.stats->backward_tiles.full += grads.tiles.full;
    ctx.stats->backward_tiles.partial += grads.tiles.partial;
    ctx.stats->backward_tiles.skipped += grads.tiles.skipped;
    const Tensor dkv_part = raw::to(raw::cat({grads.dk, grads.dv}, -1), acc);
    if (!dq.defined()) {
      dq = raw::to(grads.dq, acc);
      dkv_all = dkv_part;
    } else {
      raw::add_(dq, raw::to(grads.dq, acc));
      raw::add_(dkv_all, dkv_part);
    }
  }
  // MLA latent: dK/dV of every gathered token projected through the up-projection on this rank;
  // only the latent's gradient is reduce-scattered.
  if (ctx.latent) {
    const int64_t d_qk = k_all.size(-1), d_v = v_all.size(-1);
    dkv_all = ctx.latent->project_grad(latent_all, raw::narrow(dkv_all, -1, 0, d_qk), raw::narrow(dkv_all, -1, d_qk, d_v), acc);
  }
  // dK/dV (or the latent's gradient) of every gathered token, back in rank order, summed onto the owners.
  const Tensor dkv = to_member_major(dkv_all, full);
  ctx.count_sent(dkv, 1, ctx.cp_size - 1, ctx.cp_size);
  const Tensor mine = ctx.groups.group->reduce_scatter(dkv, 0);
  if (ctx.latent) return {raw::to(dq, q.dtype()), raw::to(mine, k.dtype()), Tensor()};
  const int64_t d_qk = k.size(-1), d_v = v.size(-1);
  return {raw::to(dq, q.dtype()), raw::to(raw::contiguous(raw::narrow(mine, -1, 0, d_qk)), k.dtype()),
          raw::to(raw::contiguous(raw::narrow(mine, -1, d_qk, d_v)), v.dtype())};
}

}  // namespace cpf::cp
