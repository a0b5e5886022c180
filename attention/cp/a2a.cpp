// a2a: Ulysses. Trade the sequence split for a head split, attend over the whole sequence, trade back.
//
// P = 2, H = 4 heads, sequence chunks C0..C3 (rank 0 holds C0|C3, rank 1 holds C1|C2):
//
//     before              all-to-all (heads)           attention                after (inverse a2a)
//     rank 0: C0 C3 x h0-h3  -> rank 0: C0 C3 C1 C2 x h0 h1   full sequence, h0 h1   rank 0: C0 C3 x h0-h3
//     rank 1: C1 C2 x h0-h3  -> rank 1: C0 C3 C1 C2 x h2 h3   full sequence, h2 h3   rank 1: C1 C2 x h0-h3
//
// The gathered tokens arrive in rank order; each token keeps its global position, so the single
// attention call sees the true sequence under every mask and window, with no reordering kernel.
// GQA: KV heads split the same way when num_kv_heads >= P. With fewer KV heads than ranks (MQA, or
// GQA with few groups) each KV head is replicated so that rank j receives the KV head its query
// heads use (TransformerEngine refuses this case); the replicas' gradients are summed back.
// MLA (d_qk != d_v) needs nothing special: V and O travel with their own head dim.
//
// Backward: dO comes in through the same all-to-all, one attention backward runs on the gathered
// state kept from the forward, and dQ/dK/dV go back through the inverse all-to-all.
#include "attention/cp/strategy.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::cp {
namespace {

// (Hq, T) lse <-> (T, Hq, 1) rows, so it can travel through the token-wise exchanges.
Tensor lse_as_rows(const Tensor& lse) { return raw::contiguous(raw::unsqueeze(raw::transpose(lse, 0, 1), -1)); }
Tensor rows_as_lse(const Tensor& rows) { return raw::contiguous(raw::transpose(raw::squeeze(rows, -1), 0, 1)); }

struct UlyssesGroup {
  dist::ProcessGroup* group;
  GroupLayout layout;  // the gathered tokens of all members, sequence-major
};

UlyssesGroup whole_group(const CpContext& ctx) {
  std::vector<int> members;
  for (int r = 0; r < static_cast<int>(ctx.cp_size); ++r) members.push_back(r);
  return {ctx.groups.group.get(), make_group_layout(ctx.global, ctx.cp_size, members)};
}

}  // namespace

std::vector<Tensor> ulysses_in(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                               const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t a2a = group.size();
  return {to_sequence_major(seq_to_head_split(ctx, group, q), layout),
          to_sequence_major(seq_to_head_split(ctx, group, replicate_kv_heads(k, a2a)), layout),
          to_sequence_major(seq_to_head_split(ctx, group, replicate_kv_heads(v, a2a)), layout)};
}

CpForward ulysses_out(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                      const Tensor& out_heads, const Tensor& lse_heads) {
  Tensor out = head_to_seq_split(ctx, group, to_member_major(out_heads, layout));
  Tensor lse = rows_as_lse(head_to_seq_split(ctx, group, to_member_major(lse_as_rows(lse_heads), layout)));
  return {out, lse, {}};
}

// dO and dlse of this rank's tokens -> the gathered head slice (sequence-major).
std::pair<Tensor, Tensor> ulysses_grad_in(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                                          const Tensor& dout, const Tensor& dlse) {
  Tensor dout_heads = to_sequence_major(seq_to_head_split(ctx, group, dout), layout);
  Tensor dlse_heads;
  if (dlse.defined()) dlse_heads = rows_as_lse(to_sequence_major(seq_to_head_split(ctx, group, lse_as_rows(dlse)), layout));
  return {dout_heads, dlse_heads};
}

CpGrads ulysses_grad_out(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                         const CpGrads& heads, const Tensor& k) {
  Tensor dq = head_to_seq_split(ctx, group, to_member_major(heads.dq, layout));
  Tensor dk = head_to_seq_split(ctx, group, to_member_major(heads.dk, layout));
  Tensor dv = head_to_seq_split(ctx, group, to_member_major(heads.dv, layout));
  return {dq, reduce_replicated_kv_heads(dk, k.size(1)), reduce_replicated_kv_heads(dv, k.size(1))};
}

CpForward a2a_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  const UlyssesGroup u = whole_group(ctx);
  const auto qkv = ulysses_in(ctx, *u.group, u.layout, q, k, v);
  const auto result = raw::attention_forward(qkv[0], qkv[1], qkv[2], ctx.spec,
                                             pair_sequence_info(u.layout, u.layout), ctx.groups.kernel_config);
  ctx.stats->forward_tiles.full += result.tiles.full;
  ctx.stats->forward_tiles.partial += result.tiles.partial;
  ctx.stats->forward_tiles.skipped += result.tiles.skipped;
  // The sink joins the merged rows of this rank's head slice; the backward uses those rows.
  const CpForward heads = with_sink(ctx, {result.out, result.lse, {}}, u.group->rank() * qkv[0].size(1));
  CpForward forward = ulysses_out(ctx, *u.group, u.layout, heads.out, heads.lse);
  forward.extra = {qkv[0], qkv[1], qkv[2], heads.out, heads.lse};
  return forward;
}

CpGrads a2a_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                     const Tensor& v, const CpSaved& saved) {
  const UlyssesGroup u = whole_group(ctx);
  const auto [dout_heads, dlse_heads] = ulysses_grad_in(ctx, *u.group, u.layout, dout, dlse);
  const auto& e = saved.extra;  // q, k, v, out, lse of the gathered head slice
  const auto grads = raw::attention_backward(dout_heads, dlse_heads, e[0], e[1], e[2], e[3], e[4], ctx.spec,
                                             pair_sequence_info(u.layout, u.layout), ctx.groups.kernel_config);
  ctx.stats->backward_tiles.full += grads.tiles.full;
  ctx.stats->backward_tiles.partial += grads.tiles.partial;
  ctx.stats->backward_tiles.skipped += grads.tiles.skipped;
  return ulysses_grad_out(ctx, *u.group, u.layout, {grads.dq, grads.dk, grads.dv}, k);
}

}  // namespace cpf::cp
