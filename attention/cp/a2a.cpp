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
// Pipelining by head groups: each member's heads split into g groups (rank j, group i: heads
// [j H/P + i H/(P g), j H/P + (i+1) H/(P g))). Every group's all-to-alls are posted up front on the
// group's communication stream; group i attends as soon as its q, k, v landed, while group i+1's are
// still in flight, and its out/lse go back while group i+1 attends. Only the first group's exchange
// in and the last one's out are exposed. g = 4, rank 0 of 2:
//
//     comm     in0 in1 in2 in3 .  out0 out1 out2 out3
//     compute      att0 att1 att2 att3
//
// Backward: dO comes in through the same pipelined all-to-alls, each head group's attention backward
// runs on the gathered state kept from the forward, and dQ/dK/dV go back as each group finishes.
#include "attention/cp/layout_cache.h"
#include "attention/cp/strategy.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"

#include <array>

namespace cpf::cp {
namespace {

constexpr int kSavedPerGroup = 5;  // q, k, v, out, lse of one head group

// (Hq, T) lse <-> (T, Hq, 1) rows, so it can travel through the token-wise exchanges.
Tensor lse_as_rows(const Tensor& lse) { return raw::contiguous(raw::unsqueeze(raw::transpose(lse, 0, 1), -1)); }
Tensor rows_as_lse(const Tensor& rows) { return raw::contiguous(raw::transpose(raw::squeeze(rows, -1), 0, 1)); }

// Head group i of a local (T, H, D) tensor split over `members`: member j's heads
// [j H/A + i H/(A g), j H/A + (i+1) H/(A g)) for every j, as (T, H/g, D) in member order (what the
// all-to-all splits among the members).
Tensor head_group(const Tensor& x, int64_t members, int64_t groups, int64_t i) {
  if (groups == 1) return x;
  const int64_t t = x.size(0), h = x.size(1), d = x.size(2);
  const Tensor split = raw::reshape(raw::contiguous(x), {t, members, groups, h / (members * groups), d});
  return raw::reshape(raw::contiguous(raw::narrow(split, 2, i, 1)), {t, h / groups, d});
}

// The inverse: the head groups' (T, H/g, D) pieces back into one (T, H, D).
Tensor join_head_groups(const std::vector<Tensor>& parts, int64_t members) {
  if (parts.size() == 1) return parts[0];
  const int64_t t = parts[0].size(0), per = parts[0].size(1) / members, d = parts[0].size(2);
  std::vector<Tensor> views;
  for (const Tensor& p : parts) views.push_back(raw::reshape(raw::contiguous(p), {t, members, 1, per, d}));
  return raw::reshape(raw::cat(views, 2), {t, members * per * static_cast<int64_t>(parts.size()), d});
}

// One all-to-all posted on `group`: sequence -> head split (split_dim 1, concat_dim 0) or back.
dist::WorkPtr post_exchange(const CpContext& ctx, dist::ProcessGroup& group, const Tensor& t, int64_t split_dim,
                            int64_t concat_dim) {
  ctx.count_sent(t, 1, group.size() - 1, group.size());
  return group.all_to_all_async(raw::contiguous(t), split_dim, concat_dim);
}

Tensor received(const dist::WorkPtr& work) { return raw::contiguous(work->wait_tensor()); }

dist::ProcessGroup& whole_group(const CpContext& ctx) { return *ctx.config.group; }

std::shared_ptr<const GroupLayout> whole_layout(const CpContext& ctx) {
  std::vector<int> members;
  for (int r = 0; r < static_cast<int>(ctx.cp_size); ++r) members.push_back(r);
  return cached_group_layout(ctx.global, ctx.cp_size, members);
}

}  // namespace

int64_t choose_a2a_head_groups(int64_t q_heads, int64_t kv_heads, int64_t tokens) {
  // Measured on 2 and 4 H200s over NVLink (docs/cp.md, "a2a"): every split was slower than one group at
  // 16k and 64k tokens per GPU (4 GPUs: 37.1 vs 32.9 ms, 606 vs 513 ms): the all-to-alls are small against
  // the attention, and splitting the heads makes each cuDNN call smaller and adds calls. So the automatic
  // choice is one group; the option stays for links where the exchange is the larger cost.
  (void)q_heads;
  (void)kv_heads;
  (void)tokens;
  return 1;
}

std::string a2a_head_groups_problem(int64_t head_groups, int64_t q_heads, int64_t kv_heads) {
  if (head_groups <= 0 || (q_heads % head_groups == 0 && kv_heads % head_groups == 0)) return "";
  return str_cat("does not divide the ", q_heads, " query heads and ", kv_heads,
                 " KV heads each rank attends after the all-to-all; use 0 (automatic) or a common divisor of ", q_heads,
                 " and ", kv_heads);
}

int64_t a2a_head_groups(const CpContext& ctx, int64_t q_heads, int64_t kv_heads, int64_t tokens) {
  const int requested = ctx.config.a2a_head_groups;
  CPF_CHECK(requested >= 0, "context parallel (", comm_type_name(ctx.config.comm_type),
            "): a2a_head_groups=", requested,
            " is negative; use 0 (automatic) or a count dividing the heads each rank attends");
  if (requested == 0) return choose_a2a_head_groups(q_heads, kv_heads, tokens);
  const std::string problem = a2a_head_groups_problem(requested, q_heads, kv_heads);
  CPF_CHECK(problem.empty(), "context parallel (", comm_type_name(ctx.config.comm_type),
            "): a2a_head_groups=", requested, " ", problem);
  return requested;
}

CpForward ulysses_pipelined_forward(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                                    const Tensor& q, const Tensor& k, const Tensor& v, int64_t head_groups,
                                    const HeadGroupAttend& attend) {
  const int64_t a = group.size(), g = head_groups;
  const Tensor k_rep = replicate_kv_heads(k, a), v_rep = replicate_kv_heads(v, a);
  std::vector<std::array<dist::WorkPtr, 3>> in;  // every group's q, k, v exchange, posted up front
  {
    const profile::Scope scope("cp/a2a/exchange");
    for (int64_t i = 0; i < g; ++i) {
      in.push_back({post_exchange(ctx, group, head_group(q, a, g, i), 1, 0),
                    post_exchange(ctx, group, head_group(k_rep, a, g, i), 1, 0),
                    post_exchange(ctx, group, head_group(v_rep, a, g, i), 1, 0)});
    }
  }
  const int64_t group_heads = q.size(1) / (a * g);  // query heads of one group on one member
  std::vector<std::array<dist::WorkPtr, 2>> out;
  CpForward forward;
  for (int64_t i = 0; i < g; ++i) {
    std::array<Tensor, 3> qkv;  // (A T, H/(A g), D) sequence-major
    {
      const profile::Scope scope("cp/a2a/exchange");
      for (size_t j = 0; j < 3; ++j) qkv[j] = to_sequence_major(received(in[i][j]), layout);
      in[i] = {};
    }
    CpForward heads;
    {
      const profile::Scope scope("cp/a2a/attend");
      heads = attend(qkv[0], qkv[1], qkv[2], group.rank() * (q.size(1) / a) + i * group_heads);
    }
    {
      const profile::Scope scope("cp/a2a/exchange");
      out.push_back({post_exchange(ctx, group, to_member_major(heads.out, layout), 0, 1),
                     post_exchange(ctx, group, to_member_major(lse_as_rows(heads.lse), layout), 0, 1)});
    }
    for (const Tensor& t : {qkv[0], qkv[1], qkv[2], heads.out, heads.lse}) forward.extra.push_back(t);
  }
  const profile::Scope scope("cp/a2a/exchange");
  std::vector<Tensor> outs, lses;  // (T, H/g, Dv) and (T, H/g, 1) per group
  for (const auto& works : out) {
    outs.push_back(received(works[0]));
    lses.push_back(received(works[1]));
  }
  forward.out = join_head_groups(outs, a);
  forward.lse = rows_as_lse(join_head_groups(lses, a));
  return forward;
}

CpGrads ulysses_pipelined_backward(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                                   const Tensor& dout, const Tensor& dlse, const Tensor& k,
                                   const std::vector<Tensor>& saved, const HeadGroupAttendGrad& attend_grad) {
  const int64_t a = group.size(), g = static_cast<int64_t>(saved.size()) / kSavedPerGroup;
  CPF_CHECK(g >= 1 && static_cast<int64_t>(saved.size()) == g * kSavedPerGroup, "a2a backward: ", saved.size(),
            " saved tensors are not ", kSavedPerGroup, " per head group");
  const Tensor dlse_rows = dlse.defined() ? lse_as_rows(dlse) : Tensor();
  std::vector<std::array<dist::WorkPtr, 2>> in;  // every group's dO (and dlse) exchange, posted up front
  {
    const profile::Scope scope("cp/a2a/exchange");
    for (int64_t i = 0; i < g; ++i) {
      in.push_back({post_exchange(ctx, group, head_group(dout, a, g, i), 1, 0),
                    dlse.defined() ? post_exchange(ctx, group, head_group(dlse_rows, a, g, i), 1, 0) : nullptr});
    }
  }
  std::vector<std::array<dist::WorkPtr, 3>> out;
  for (int64_t i = 0; i < g; ++i) {
    Tensor dout_heads, dlse_heads;
    {
      const profile::Scope scope("cp/a2a/exchange");
      dout_heads = to_sequence_major(received(in[i][0]), layout);
      if (in[i][1]) dlse_heads = rows_as_lse(to_sequence_major(received(in[i][1]), layout));
      in[i] = {};
    }
    CpGrads heads;
    {
      const profile::Scope scope("cp/a2a/attend");
      heads = attend_grad(dout_heads, dlse_heads, saved.data() + i * kSavedPerGroup);
    }
    const profile::Scope scope("cp/a2a/exchange");
    out.push_back({post_exchange(ctx, group, to_member_major(heads.dq, layout), 0, 1),
                   post_exchange(ctx, group, to_member_major(heads.dk, layout), 0, 1),
                   post_exchange(ctx, group, to_member_major(heads.dv, layout), 0, 1)});
  }
  const profile::Scope scope("cp/a2a/exchange");
  std::array<std::vector<Tensor>, 3> grads;  // dq, dk, dv pieces per group, (T, heads/g, D)
  for (const auto& works : out) {
    for (size_t j = 0; j < 3; ++j) grads[j].push_back(received(works[j]));
  }
  return {join_head_groups(grads[0], a), reduce_replicated_kv_heads(join_head_groups(grads[1], a), k.size(1)),
          reduce_replicated_kv_heads(join_head_groups(grads[2], a), k.size(1))};
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
  if (dlse.defined())
    dlse_heads = rows_as_lse(to_sequence_major(seq_to_head_split(ctx, group, lse_as_rows(dlse)), layout));
  return {dout_heads, dlse_heads};
}

CpForward a2a_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  dist::ProcessGroup& group = whole_group(ctx);
  const auto layout_ptr = whole_layout(ctx);
  const GroupLayout& layout = *layout_ptr;
  const int64_t a = group.size();
  const int64_t g = a2a_head_groups(ctx, q.size(1) / a, std::max<int64_t>(k.size(1), a) / a, layout.tokens());
  const SequenceInfo info = pair_sequence_info(layout, layout);
  return ulysses_pipelined_forward(
      ctx, group, layout, q, k, v, g, [&](const Tensor& qh, const Tensor& kh, const Tensor& vh, int64_t first_head) {
        const auto result = raw::attention_forward(qh, kh, vh, ctx.spec, info, ctx.config.kernel_config);
        ctx.stats->forward_tiles.full += result.tiles.full;
        ctx.stats->forward_tiles.partial += result.tiles.partial;
        ctx.stats->forward_tiles.skipped += result.tiles.skipped;
        // The sink joins the rows of this head group; the backward uses those rows.
        return with_sink(ctx, {result.out, result.lse, {}}, first_head);
      });
}

CpGrads a2a_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& /*q*/, const Tensor& k,
                     const Tensor& /*v*/, const CpSaved& saved) {
  dist::ProcessGroup& group = whole_group(ctx);
  const auto layout_ptr = whole_layout(ctx);
  const GroupLayout& layout = *layout_ptr;
  const SequenceInfo info = pair_sequence_info(layout, layout);
  return ulysses_pipelined_backward(
      ctx, group, layout, dout, dlse, k, saved.extra, [&](const Tensor& dout_h, const Tensor& dlse_h, const Tensor* e) {
        // e: q, k, v, out, lse of this head group, sequence-major
        const auto grads = raw::attention_backward(dout_h, dlse_h, e[0], e[1], e[2], e[3], e[4], ctx.spec, info,
                                                   ctx.config.kernel_config);
        ctx.stats->backward_tiles.full += grads.tiles.full;
        ctx.stats->backward_tiles.partial += grads.tiles.partial;
        ctx.stats->backward_tiles.skipped += grads.tiles.skipped;
        return CpGrads{grads.dq, grads.dk, grads.dv};
      });
}

}  // namespace cpf::cp
