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
// sliding window trims the start). With positions on every token that is just one kernel call of
// the local queries against the gathered keys; tiles outside the mask are skipped, so rank 0's C0
// costs one diagonal tile. No LSE merge is needed: every query sees all its keys in one call.
//
// Backward gathers K and V again (not kept between passes, to save memory), computes dQ and the
// dK/dV of every gathered token, and reduce-scatters dK/dV back to their owners.
#include "attention/cp/strategy.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"

namespace cpf::cp {
namespace {

std::vector<int> all_members(const CpContext& ctx) {
  std::vector<int> members;
  for (int r = 0; r < static_cast<int>(ctx.cp_size); ++r) members.push_back(r);
  return members;
}

// K and V of every rank in sequence-major order of the whole group.
std::pair<Tensor, Tensor> gather_kv(const CpContext& ctx, const GroupLayout& full, const Tensor& k, const Tensor& v) {
  const Tensor kv = raw::cat({k, v}, -1);  // (T, Hkv, Dqk + Dv): one collective for both
  ctx.count_sent(kv, ctx.cp_size - 1);
  const Tensor gathered = to_sequence_major(ctx.groups.group->all_gather(kv, 0), full);
  const int64_t d_qk = k.size(-1), d_v = v.size(-1);
  return {raw::contiguous(raw::narrow(gathered, -1, 0, d_qk)), raw::contiguous(raw::narrow(gathered, -1, d_qk, d_v))};
}

}  // namespace

CpForward all_gather_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  const GroupLayout full = make_group_layout(ctx.global, ctx.cp_size, all_members(ctx));
  const auto [k_all, v_all] = gather_kv(ctx, full, k, v);
  const auto result = raw::attention_forward(q, k_all, v_all, ctx.spec,
                                             pair_sequence_info(ctx.own_layout(), full), ctx.groups.flash);
  ctx.stats->forward_tiles.full += result.tiles.full;
  ctx.stats->forward_tiles.partial += result.tiles.partial;
  ctx.stats->forward_tiles.skipped += result.tiles.skipped;
  return {result.out, result.lse, {}};
}

CpGrads all_gather_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                            const Tensor& k, const Tensor& v, const CpSaved& saved) {
  const GroupLayout full = make_group_layout(ctx.global, ctx.cp_size, all_members(ctx));
  const auto [k_all, v_all] = gather_kv(ctx, full, k, v);
  const auto grads = raw::attention_backward(dout, dlse, q, k_all, v_all, saved.out, saved.lse, ctx.spec,
                                             pair_sequence_info(ctx.own_layout(), full), ctx.groups.flash);
  ctx.stats->backward_tiles.full += grads.tiles.full;
  ctx.stats->backward_tiles.partial += grads.tiles.partial;
  ctx.stats->backward_tiles.skipped += grads.tiles.skipped;
  // dK/dV of every gathered token, back in rank order, summed onto the owners.
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor dkv = to_member_major(raw::to(raw::cat({grads.dk, grads.dv}, -1), acc), full);
  ctx.count_sent(dkv, 1, ctx.cp_size - 1, ctx.cp_size);
  const Tensor mine = ctx.groups.group->reduce_scatter(dkv, 0);
  const int64_t d_qk = k.size(-1), d_v = v.size(-1);
  return {grads.dq, raw::to(raw::contiguous(raw::narrow(mine, -1, 0, d_qk)), k.dtype()),
          raw::to(raw::contiguous(raw::narrow(mine, -1, d_qk, d_v)), v.dtype())};
}

}  // namespace cpf::cp
