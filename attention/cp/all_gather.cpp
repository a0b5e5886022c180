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
// Overlapped path (causal or unmasked, default positions; docs/cp.md, "all_gather"): the gather is
// posted first, and while it is in flight the rank attends its queries to its OWN keys (the ring's
// diagonal tile: D below). When the others' K/V have landed, the queries attend to the others' keys
// (O), one call per query chunk; the partial (out, lse) pairs merge in fp32. Rank 1 above:
//
//              C0  C1  C2  C3
//     C1       O   D   .   .        own keys C1|C2: one causal block over the two chunks
//     C2       O   D   D   .        others' keys C0|C3: each query chunk sees a plain block
//
// Without own keys in it, every query chunk sees a prefix of the others' keys with no diagonal: an
// unmasked block cuDNN runs at full rate. A chunk that sees no other key (rank 0's C0) costs nothing.
// Other masks (sliding windows, explicit positions) keep the single-gather path: the local queries
// against the whole gathered sequence in one call per chunk (a band cuDNN runs fused); the others'
// keys with a hole where the own chunks were would not be one band there.
//
// Backward re-gathers K and V (nothing of the gathered sequence is kept between passes), overlapping
// the gather with the own-keys tile again; dQ and the others' dK/dV accumulate in fp32, the others'
// dK/dV travel back to their owners in a reduce-scatter in the input dtype (bf16 under mixed
// precision: half the bytes), and each rank adds its own-keys tile in fp32.
#include "attention/cp/layout_cache.h"
#include "attention/cp/lse_merge.h"
#include "attention/cp/strategy.h"
#include "attention/mask.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/index.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"

namespace cpf::cp {
namespace {

std::vector<int> members_except(const CpContext& ctx, int skip) {
  std::vector<int> members;
  for (int r = 0; r < static_cast<int>(ctx.cp_size); ++r) {
    if (r != skip) members.push_back(r);
  }
  return members;
}

void add_tiles(TileStats& into, const TileStats& tiles) {
  into.full += tiles.full;
  into.partial += tiles.partial;
  into.skipped += tiles.skipped;
}

// The overlapped path needs the others' keys to form one band per query chunk: a mask without a
// left window bound and with no key to the right of the query, on default positions.
bool overlapped(const CpContext& ctx) {
  const AttentionWindow window = effective_window(ctx.spec);
  return window.left < 0 && window.right <= 0 && ctx.global.q_positions.empty() && ctx.global.kv_positions.empty();
}

// The gather of this rank's K and V (or MLA latent) posted on the group: one collective per tensor
// (no packing copy, and each lands ready to use).
struct PendingGather {
  std::vector<dist::WorkPtr> works;
  std::vector<Tensor> wait() const {
    std::vector<Tensor> gathered;
    for (const auto& w : works) gathered.push_back(w->wait_tensor());
    return gathered;
  }
};

PendingGather post_gather(const CpContext& ctx, const Tensor& k, const Tensor& v) {
  const profile::Scope scope("cp/all_gather/gather");
  PendingGather pending;
  for (const Tensor& t : ctx.latent ? std::vector<Tensor>{k} : std::vector<Tensor>{k, v}) {
    ctx.count_sent(t, ctx.cp_size - 1);
    pending.works.push_back(ctx.config.group->all_gather_async(raw::contiguous(t), 0));
  }
  return pending;
}

// Every rank holds the same number of tokens: 1/P of each sequence's slot (sharding.h).
int64_t rank_tokens(const CpContext& ctx) { return ctx.global.cu_seqlens_padded.back() / ctx.cp_size; }

// Rows of a member-major gather (every rank's tokens in rank order) that make `layout`'s
// sequence-major storage; `layout` may leave out some ranks (the others' keys skip this rank's).
Tensor gathered_rows(const CpContext& ctx, const GroupLayout& layout) {
  const int64_t n = rank_tokens(ctx);
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(layout.tokens()));
  for (int64_t s = 0; s < layout.tokens(); ++s) {
    const int64_t mm = layout.to_sequence_major[s];  // in the layout's member-major order
    rows.push_back(layout.members[static_cast<size_t>(mm / n)] * n + mm % n);
  }
  return from_vector(rows, {layout.tokens()}, Device::cpu());
}

// The gathered K and V, expanded (MLA latent) and reordered by `rows` (gathered_rows, on the device) to a
// layout's sequence-major storage. `latent_out` receives the reordered latent when the latent travels.
std::pair<Tensor, Tensor> arrange_kv(const CpContext& ctx, const Tensor& rows, const std::vector<Tensor>& gathered,
                                     Tensor* latent_out = nullptr) {
  if (ctx.latent) {
    const Tensor latent = raw::index_select(gathered[0], 0, rows);  // (S, 1, r + rope)
    if (latent_out) *latent_out = latent;
    return ctx.latent->expand(latent);
  }
  return {raw::index_select(gathered[0], 0, rows), raw::index_select(gathered[1], 0, rows)};  // (S, Hkv, D)
}

// This rank's own K and V (expanded from the latent under MLA latent communication).
std::pair<Tensor, Tensor> own_kv(const CpContext& ctx, const Tensor& k, const Tensor& v) {
  return ctx.latent ? ctx.latent->expand(k) : std::pair<Tensor, Tensor>{k, v};
}

// Whether any real query of `part` sees a real key of `kv` (position hulls; exact for the masks of the
// overlapped path). Calls that see nothing are skipped: cuDNN refuses them and they add nothing.
bool part_sees_keys(const SequenceInfo& part, const GroupLayout& kv, const AttentionWindow& window) {
  for (int64_t n = 0; n < part.num_sequences(); ++n) {
    const int64_t q_len = part.q_length(n), k_len = kv.info.q_length(n);
    if (q_len == 0 || k_len == 0) continue;
    const PositionRange q = position_range(part.q_positions.data() + part.q_start(n), q_len);
    const PositionRange k = position_range(kv.info.kv_positions.data() + kv.info.q_start(n), k_len);
    if (classify_tile(q, k, window) != TileKind::empty) return true;
  }
  return false;
}

// The local queries against `kv`'s keys: one call per query chunk (split_query_runs; an unmasked call
// stays one), the calls that see nothing left out.
std::vector<SequenceInfo> query_parts(const CpContext& ctx, const GroupLayout& own, const GroupLayout& kv) {
  const SequenceInfo pair = pair_sequence_info(own, kv);
  const AttentionWindow window = effective_window(ctx.spec);
  if (window.left < 0 && window.right < 0) return {pair};  // no mask: positions do not matter
  // Split by chunk (runs of slot indices), not by runs of positions: explicit positions with gaps
  // would make every query its own run.
  std::vector<SequenceInfo> parts;
  for (SequenceInfo& part : split_query_runs(pair, own.slot_index)) {
    if (part_sees_keys(part, kv, window)) parts.push_back(std::move(part));
  }
  return parts;
}

// The keys the gathered call attends to: the others' (overlapped path) or everyone's.
std::shared_ptr<const GroupLayout> gathered_layout(const CpContext& ctx, bool overlap) {
  return cached_group_layout(ctx.global, ctx.cp_size, members_except(ctx, overlap ? ctx.cp_rank : -1));
}

}  // namespace

CpForward all_gather_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  const bool overlap = overlapped(ctx);
  const PendingGather pending = post_gather(ctx, k, v);
  PartialMerge merge(q.size(0), q.size(1), ctx.value_dim(v), q.dtype(), q.device());
  auto attend = [&](const Tensor& keys, const Tensor& values, const SequenceInfo& info) {
    const profile::Scope scope("cp/all_gather/attend");
    const auto result = raw::attention_forward(q, keys, values, ctx.spec, info, ctx.config.kernel_config);
    add_tiles(ctx.stats->forward_tiles, result.tiles);
    merge.add(result.out, result.lse);
  };
  const auto own_ptr = cached_group_layout(ctx.global, ctx.cp_size, {ctx.cp_rank});
  const GroupLayout& own = *own_ptr;  // this rank's queries (and keys)
  if (overlap) {                      // the own-keys tile while the gather is in flight
    const auto [k_own, v_own] = own_kv(ctx, k, v);
    attend(k_own, v_own, pair_sequence_info(own, own));
  }
  // Host work (layouts, row order, query parts) while the gather and the own tile run.
  const auto layout_ptr = gathered_layout(ctx, overlap);
  const GroupLayout& layout = *layout_ptr;
  const Tensor rows = raw::to(gathered_rows(ctx, layout), q.device());
  const std::vector<SequenceInfo> parts = query_parts(ctx, own, layout);
  std::vector<Tensor> gathered;
  {
    const profile::Scope scope("cp/all_gather/gather");
    gathered = pending.wait();
  }
  const auto [k_all, v_all] = arrange_kv(ctx, rows, gathered);  // (S', Hkv, D) sequence-major
  gathered.clear();
  for (const SequenceInfo& part : parts) attend(k_all, v_all, part);
  return with_sink(ctx, {merge.out(q.dtype()), merge.lse(), {}});
}

namespace {

// Runs the backward of the local queries against one key set, adding dQ into `dq` and returning the
// keys' gradient (zero when no part saw a key). `latent` is that key set's latent under MLA latent
// communication (the gradient is projected through the up-projection there).
Tensor key_set_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                        const Tensor& keys, const Tensor& values, const Tensor& latent, const CpSaved& saved,
                        const std::vector<SequenceInfo>& parts, Tensor& dq) {
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor dkv;
  for (const SequenceInfo& part : parts) {
    const profile::Scope scope("cp/all_gather/attend");
    const auto grads = raw::attention_backward(dout, dlse, q, keys, values, saved.out, saved.lse, ctx.spec, part,
                                               ctx.config.kernel_config);
    add_tiles(ctx.stats->backward_tiles, grads.tiles);
    const Tensor part_dkv = raw::to(raw::cat({grads.dk, grads.dv}, -1), acc);
    if (!dq.defined()) {
      dq = raw::to(grads.dq, acc);
    } else {
      raw::add_(dq, raw::to(grads.dq, acc));
    }
    if (!dkv.defined()) {
      dkv = part_dkv;
    } else {
      raw::add_(dkv, part_dkv);
    }
  }
  const int64_t d_qk = keys.size(-1), d_v = values.size(-1);
  if (!dkv.defined()) dkv = zeros({keys.size(0), keys.size(1), d_qk + d_v}, {.dtype = acc, .device = q.device()});
  // MLA latent: dK/dV projected through the up-projection on this rank; only the latent's gradient travels.
  if (ctx.latent)
    dkv = ctx.latent->project_grad(latent, raw::narrow(dkv, -1, 0, d_qk), raw::narrow(dkv, -1, d_qk, d_v), acc);
  return dkv;
}

// dK/dV of `layout`'s keys (sequence-major) summed onto their owners, travelling in `wire` dtype. When
// `layout` leaves this rank out (the overlapped path), its rows of the reduce-scatter are zeros: its
// own-keys tile is added after, in fp32.
Tensor reduce_to_owners(const CpContext& ctx, const GroupLayout& layout, const Tensor& dkv, DType wire) {
  Tensor member_major = raw::to(to_member_major(dkv, layout), wire);
  if (layout.members.size() < static_cast<size_t>(ctx.cp_size)) {  // the others' keys: zeros for this rank
    const int64_t own = rank_tokens(ctx), start = ctx.cp_rank * own;
    Shape shape = member_major.shape();
    shape[0] = own;
    const Tensor zero = zeros(shape, {.dtype = wire, .device = dkv.device()});
    member_major = raw::cat({raw::narrow(member_major, 0, 0, start), zero,
                             raw::narrow(member_major, 0, start, member_major.size(0) - start)},
                            0);
  }
  ctx.count_sent(member_major, 1, ctx.cp_size - 1, ctx.cp_size);
  const profile::Scope scope("cp/all_gather/gather");
  return ctx.config.group->reduce_scatter(member_major, 0);
}

}  // namespace

CpGrads all_gather_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                            const Tensor& k, const Tensor& v, const CpSaved& saved) {
  const bool overlap = overlapped(ctx);
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const PendingGather pending = post_gather(ctx, k, v);  // re-gathered: nothing was kept from the forward
  Tensor dq, own_dkv;
  const auto own_ptr = cached_group_layout(ctx.global, ctx.cp_size, {ctx.cp_rank});
  const GroupLayout& own = *own_ptr;  // this rank's queries (and keys)
  if (overlap) {                      // the own-keys tile while the gather is in flight
    const auto [k_own, v_own] = own_kv(ctx, k, v);
    own_dkv = key_set_backward(ctx, dout, dlse, q, k_own, v_own, k, saved, {pair_sequence_info(own, own)}, dq);
  }
  const auto layout_ptr = gathered_layout(ctx, overlap);
  const GroupLayout& layout = *layout_ptr;
  const Tensor rows = raw::to(gathered_rows(ctx, layout), q.device());
  const std::vector<SequenceInfo> parts = query_parts(ctx, own, layout);
  Tensor latent_all;  // MLA latent communication: the gathered latent, sequence-major
  std::vector<Tensor> gathered;
  {
    const profile::Scope scope("cp/all_gather/gather");
    gathered = pending.wait();
  }
  auto [k_all, v_all] = arrange_kv(ctx, rows, gathered, &latent_all);
  gathered.clear();
  const Tensor dkv_all = key_set_backward(ctx, dout, dlse, q, k_all, v_all, latent_all, saved, parts, dq);
  k_all = v_all = Tensor();  // the gathered sequence is released before the reduce-scatter
  // The wire dtype is the input's (bf16 under mixed precision); the sums above stayed in fp32.
  const Tensor received = reduce_to_owners(ctx, layout, dkv_all, k.dtype());
  Tensor mine = raw::to(received, acc);
  if (own_dkv.defined()) raw::add_(mine, own_dkv);
  if (!dq.defined()) dq = zeros(q.shape(), {.dtype = acc, .device = q.device()});
  if (ctx.latent) return {raw::to(dq, q.dtype()), raw::to(mine, k.dtype()), Tensor()};
  const int64_t d_qk = k.size(-1), d_v = v.size(-1);
  return {raw::to(dq, q.dtype()), raw::to(raw::contiguous(raw::narrow(mine, -1, 0, d_qk)), k.dtype()),
          raw::to(raw::contiguous(raw::narrow(mine, -1, d_qk, d_v)), v.dtype())};
}

}  // namespace cpf::cp
