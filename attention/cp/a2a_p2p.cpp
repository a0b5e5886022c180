// a2a+p2p: Ulysses inside each a2a sub-group, ring attention across the p2p sub-groups.
//
// CP = 4 = a2a 2 x p2p 2; a2a groups are runs of consecutive CP ranks {0,1} {2,3}, p2p groups
// {0,2} {1,3} (framework/distributed/device_mesh.h). Chunks C0..C7, rank r holds Cr | C(7-r):
//
//     rank   holds      after the a2a (heads split in two)        ring over p2p group {0,2} / {1,3}
//     0      C0 C7  ->  C0 C7 C1 C6  heads 0..H/2                  blocks {C0 C7 C1 C6} and {C2 C5 C3 C4}
//     1      C1 C6  ->  C0 C7 C1 C6  heads H/2..H                  travel around the ring of each head half
//     2      C2 C5  ->  C2 C5 C3 C4  heads 0..H/2
//     3      C3 C4  ->  C2 C5 C3 C4  heads H/2..H
//
// After the a2a each rank holds its a2a group's tokens (a dual-chunk layout of the p2p group with
// double-size chunks, as in TransformerEngine) for H/A heads; the ring of p2p.cpp then runs with
// each member's storage described by its a2a group's layout. Positions on every token keep the
// masks exact; the output and lse go back through the inverse a2a. The a2a stage is pipelined by
// head groups as in a2a.cpp: the ring of head group i runs while group i+1's all-to-all is in flight
// (the MLA latent path keeps one group: it all-gathers the latent instead of trading K/V heads).
#include "attention/cp/layout_cache.h"
#include "attention/cp/strategy.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::cp {

namespace {

struct Hierarchy {
  dist::ProcessGroup* a2a;
  dist::ProcessGroup* p2p;
  GroupLayout own;                   // this rank's a2a group, sequence-major
  std::vector<GroupLayout> members;  // per p2p member: its a2a group's layout
};

// a2a groups must be runs of consecutive CP ranks and p2p groups the strided sets across them, the
// layout DeviceMesh builds; the ring needs to know every p2p member's a2a group.
Hierarchy hierarchy(const CpContext& ctx) {
  CPF_CHECK(ctx.config.a2a_group && ctx.config.p2p_group,
            "a2a+p2p: ContextParallel needs a2a_group and p2p_group (build them with dist::DeviceMesh)");
  Hierarchy h{ctx.config.a2a_group.get(), ctx.config.p2p_group.get(), {}, {}};
  const int a2a = h.a2a->size(), p2p = h.p2p->size();
  CPF_CHECK(static_cast<int64_t>(a2a) * p2p == ctx.cp_size, "a2a+p2p: a2a group size ", a2a, " x p2p group size ", p2p,
            " != cp size ", ctx.cp_size);
  const std::vector<int> a2a_ranks = ctx.cp_ranks_of(*h.a2a);
  const std::vector<int> p2p_ranks = ctx.cp_ranks_of(*h.p2p);
  const int base = ctx.cp_rank / a2a * a2a;
  for (int i = 0; i < a2a; ++i) {
    CPF_CHECK(a2a_ranks[i] == base + i, "a2a+p2p: the a2a group must be the consecutive CP ranks ", base, "..",
              base + a2a - 1, " in order; got CP ranks ", a2a_ranks);
  }
  for (int j = 0; j < p2p; ++j) {
    CPF_CHECK(p2p_ranks[j] == j * a2a + ctx.cp_rank % a2a, "a2a+p2p: the p2p group of CP rank ", ctx.cp_rank,
              " must be the CP ranks with stride ", a2a, "; got ", p2p_ranks);
    std::vector<int> group;
    for (int i = 0; i < a2a; ++i) group.push_back(j * a2a + i);
    h.members.push_back(*cached_group_layout(ctx.global, ctx.cp_size, group));  // a copy, without the sort
  }
  h.own = h.members[h.p2p->rank()];
  return h;
}

// MLA latent communication (latent_kv.h): q goes through the a2a as usual, but instead of trading K/V
// heads the a2a group all-gathers the latent; the ring then moves the a2a group's latent and every rank
// expands its head slice [a H/A, (a+1) H/A) with the matching rows of the up-projection.
int64_t slice_heads(const CpContext& ctx, const Hierarchy& h) { return ctx.latent->shape().num_heads / h.a2a->size(); }

CpContext with_latent_slice(const CpContext& ctx, std::shared_ptr<LatentKv> slice) {
  CpContext sliced = ctx;
  sliced.latent = std::move(slice);
  return sliced;
}

CpForward latent_forward(const CpContext& ctx, const Hierarchy& h, const Tensor& q, const Tensor& latent) {
  const int64_t heads = slice_heads(ctx, h), first = h.a2a->rank() * heads;
  const Tensor q_heads = to_sequence_major(seq_to_head_split(ctx, *h.a2a, q), h.own);
  ctx.count_sent(latent, h.a2a->size() - 1);
  const Tensor latent_group = to_sequence_major(h.a2a->all_gather(raw::contiguous(latent), 0), h.own);
  const CpContext sliced = with_latent_slice(ctx, std::make_shared<LatentKv>(ctx.latent->head_slice(first, heads)));
  const CpForward ring =
      with_sink(ctx, ring_forward(sliced, *h.p2p, h.members, q_heads, latent_group, Tensor()), first);
  CpForward forward = ulysses_out(ctx, *h.a2a, h.own, ring.out, ring.lse);
  forward.extra = {q_heads, latent_group, ring.out, ring.lse};
  return forward;
}

CpGrads latent_backward(const CpContext& ctx, const Hierarchy& h, const Tensor& dout, const Tensor& dlse,
                        const CpSaved& saved) {
  const int64_t heads = slice_heads(ctx, h), first = h.a2a->rank() * heads;
  const auto [dout_heads, dlse_heads] = ulysses_grad_in(ctx, *h.a2a, h.own, dout, dlse);
  const auto& e = saved.extra;  // q, latent, out, lse of this rank's head slice, sequence-major
  auto slice = std::make_shared<LatentKv>(ctx.latent->head_slice(first, heads));
  const CpGrads g = ring_backward(with_latent_slice(ctx, slice), *h.p2p, h.members, dout_heads, dlse_heads, e[0], e[1],
                                  Tensor(), {e[2], e[3], {}});
  ctx.latent->add_slice_grads(*slice, first);
  // dq back through the inverse a2a; the latent's gradient (this head slice's share) summed over the
  // a2a group onto the ranks that own the tokens.
  const Tensor dq = head_to_seq_split(ctx, *h.a2a, to_member_major(g.dq, h.own));
  const Tensor dlatent = raw::contiguous(to_member_major(g.dk, h.own));
  ctx.count_sent(dlatent, 1, h.a2a->size() - 1, h.a2a->size());
  return {dq, h.a2a->reduce_scatter(dlatent, 0), Tensor()};
}

}  // namespace

CpForward a2a_p2p_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  const Hierarchy h = hierarchy(ctx);
  if (ctx.latent) return latent_forward(ctx, h, q, k);
  // The a2a stage pipelined by head groups (a2a.cpp): group i's ring runs while group i+1's exchange is
  // in flight. The sink joins the ring's merged rows of each head group, once.
  const int64_t a = h.a2a->size();
  const int64_t g = a2a_head_groups(ctx, q.size(1) / a, std::max<int64_t>(k.size(1), a) / a, h.own.tokens());
  return ulysses_pipelined_forward(
      ctx, *h.a2a, h.own, q, k, v, g, [&](const Tensor& qh, const Tensor& kh, const Tensor& vh, int64_t first_head) {
        return with_sink(ctx, ring_forward(ctx, *h.p2p, h.members, qh, kh, vh), first_head);
      });
}

CpGrads a2a_p2p_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& /*q*/,
                         const Tensor& k, const Tensor& /*v*/, const CpSaved& saved) {
  const Hierarchy h = hierarchy(ctx);
  if (ctx.latent) return latent_backward(ctx, h, dout, dlse, saved);
  return ulysses_pipelined_backward(
      ctx, *h.a2a, h.own, dout, dlse, k, saved.extra, [&](const Tensor& dout_h, const Tensor& dlse_h, const Tensor* e) {
        // e: q, k, v, out, lse of this head group, sequence-major
        return ring_backward(ctx, *h.p2p, h.members, dout_h, dlse_h, e[0], e[1], e[2], {e[3], e[4], {}});
      });
}

}  // namespace cpf::cp
