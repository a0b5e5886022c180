// p2p: ring attention over the CP group.
//
// Sharding (P = 4, S = 16, chunk c = 2): rank r holds chunks r and 2P-1-r.
//
//     sequence   C0 C1 C2 C3 C4 C5 C6 C7
//     rank 0     C0 .  .  .  .  .  .  C7
//     rank 1     .  C1 .  .  .  .  C6 .
//     rank 2     .  .  C2 .  .  C5 .  .
//     rank 3     .  .  .  C3 C4 .  .  .
//
// Step i: rank r attends its queries to the KV block of rank s = (r - i) mod P while that block
// moves on to r + 1 (posted before the compute, so communication hides behind it). Causal tiles of
// rank 1 (queries C1|C6; x = visible, \ = causal diagonal, . = never computed):
//
//     step 0, kv = rank 1 (C1|C6)   step 1, kv = rank 0 (C0|C7)   step 2, kv = rank 3 (C3|C4)
//           C1  C6                        C0  C7                        C3  C4
//     C1    \   .                   C1    x   .                   C1    .   .
//     C6    x   \                   C6    x   .                   C6    x   x
//      (diagonal)                    (lower: first KV half only)   (upper: second Q half only)
//
// Tiles are not special-cased: every token carries its global position and the attention kernel
// skips position ranges the mask hides, so the same code handles causal, sliding windows (a step
// whose whole tile lies outside the window costs nothing and is counted), THD padding and bshd
// padding. Partial (out, lse) pairs merge in fp32 (lse_merge.h).
//
// Backward replays the ring: each rank adds its tile's contribution to the dK/dV of the block it
// holds and passes the sum on one hop behind the KV, so after P steps every rank has received the
// complete gradient of its own block. Tile gradients use the merged global out and lse, so they are
// exact additive contributions and need no rescaling.
#include "attention/cp/lse_merge.h"
#include "attention/cp/strategy.h"
#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"

#include <optional>

namespace cpf::cp {
namespace {

constexpr int kKvTag = 0;
constexpr int kGradTag = 1;

// K and V travel as one buffer (T, Hkv, Dqk + Dv): one message per step, and d_qk != d_v just works.
Tensor pack_kv(const Tensor& k, const Tensor& v) { return raw::cat({k, v}, -1); }

std::pair<Tensor, Tensor> unpack_kv(const Tensor& kv, int64_t d_qk) {
  const int64_t d_v = kv.size(-1) - d_qk;
  return {raw::contiguous(raw::narrow(kv, -1, 0, d_qk)), raw::contiguous(raw::narrow(kv, -1, d_qk, d_v))};
}

// What travels: K and V packed, or the MLA latent (latent_kv.h), which each rank expands on use.
Tensor travelling_kv(const CpContext& ctx, const Tensor& k, const Tensor& v) { return ctx.latent ? k : pack_kv(k, v); }
std::pair<Tensor, Tensor> block_kv(const CpContext& ctx, const Tensor& kv, int64_t d_qk) {
  return ctx.latent ? ctx.latent->expand(kv) : unpack_kv(kv, d_qk);
}

Tensor like_rows(const Tensor& t, int64_t rows, DType dtype) {
  Shape shape = t.shape();
  shape[0] = rows;
  return empty(shape, {.dtype = dtype, .device = t.device()});
}

void add_tiles(TileStats& into, const TileStats& tiles) {
  into.full += tiles.full;
  into.partial += tiles.partial;
  into.skipped += tiles.skipped;
}

// Posts the ring shift of step `step`: send the block held now to next, receive the one held at step + 1
// from prev (into `incoming`). Null on the last step, where nothing moves.
struct KvShift {
  dist::WorkPtr work;
  Tensor incoming;
};

KvShift post_kv_shift(const CpContext& ctx, dist::ProcessGroup& group, const std::vector<GroupLayout>& layouts,
                      const Tensor& kv, int step) {
  const int n = group.size(), me = group.rank();
  if (step + 1 >= n) return {};
  const int src = (me - step + n) % n;
  Tensor incoming = like_rows(kv, layouts[(src + n - 1) % n].tokens(), kv.dtype());
  ctx.count_sent(kv);
  return {group.batch_p2p_async({dist::P2POp::send(kv, (me + 1) % n, kKvTag),
                                 dist::P2POp::recv(incoming, (me + n - 1) % n, kKvTag)}),
          incoming};
}

// The ring's second compute stream: one per thread and device, kept for the thread's life. A stream
// made per call would be destroyed while tensors recorded as used on it (the received KV blocks) are
// still alive, and each new stream would start an empty cache pool in the allocator. (When the thread
// ends, the blocks cached for its side stream stay with the allocator until it frees its cache.)
const DeviceStream& ring_side_stream(Device device) {
  thread_local std::vector<DeviceStream> streams;
  for (const DeviceStream& s : streams) {
    if (s.device() == device) return s;
  }
  streams.push_back(DeviceStream::create(device));
  return streams.back();
}

std::vector<GroupLayout> single_rank_layouts(const CpContext& ctx) {
  std::vector<GroupLayout> layouts;
  for (int r = 0; r < static_cast<int>(ctx.cp_size); ++r) layouts.push_back(make_group_layout(ctx.global, ctx.cp_size, {r}));
  return layouts;
}

}  // namespace

CpForward ring_forward(const CpContext& ctx, dist::ProcessGroup& group, const std::vector<GroupLayout>& layouts,
                       const Tensor& q, const Tensor& k, const Tensor& v) {
  const int n = group.size(), me = group.rank();
  const int64_t d_qk = k.size(-1);
  const AttentionWindow window = effective_window(ctx.spec);
  Tensor kv = travelling_kv(ctx, k, v);  // (T, Hkv, Dqk + Dv), or the latent (T, 1, r + rope)
  PartialMerge merge(q.size(0), q.size(1), ctx.value_dim(v), q.dtype(), q.device());
  // Two compute streams, alternating by computed tile (docs/cp.md, "On GPUs"): consecutive tiles may run side by side,
  // which fills the GPU's tail waves; on the CPU both are the one in-order stream. A tile's partial
  // result is merged on the main stream after the next tile was queued, so the merge never holds
  // the next tile back.
  const DeviceStream main_stream = DeviceStream::current(q.device());
  const DeviceStream side_stream = ctx.streams == 2 ? ring_side_stream(q.device()) : main_stream;
  side_stream.wait_for(main_stream);  // q, k, v and kv are ready there
  struct Pending {
    raw::AttentionForward result;
    bool on_side = false;
  };
  std::optional<Pending> pending;
  auto merge_pending = [&] {
    if (!pending) return;
    if (pending->on_side) {
      main_stream.wait_for(side_stream);
      main_stream.record_use(pending->result.out);  // side-stream memory read by the merge
      main_stream.record_use(pending->result.lse);
    }
    merge.add(pending->result.out, pending->result.lse);
    pending.reset();
  };
  dist::WorkPtr arriving;  // the shift that brings this step's kv
  int computed = 0;        // tiles computed so far: they alternate, whichever steps a window skips
  for (int step = 0; step < n; ++step) {
    const int src = (me - step + n) % n;
    const bool visible = any_visible(layouts[me], layouts[src], window);
    const bool on_side = visible && computed % 2 == 1 && !(side_stream == main_stream);
    const DeviceStream& stream = on_side ? side_stream : main_stream;
    if (arriving) {
      const DeviceStreamScope scope(stream);
      arriving->wait();  // only this step's stream waits for the transfer
      stream.record_use(kv);
    }
    const KvShift shift = post_kv_shift(ctx, group, layouts, kv, step);  // overlaps this step's compute
    ctx.stats->ring_steps += 1;
    if (visible) {
      ++computed;
      raw::AttentionForward result;
      {
        const DeviceStreamScope scope(stream);
        const auto [k_step, v_step] = block_kv(ctx, kv, d_qk);
        result = raw::attention_forward(q, k_step, v_step, ctx.spec, pair_sequence_info(layouts[me], layouts[src]),
                                        ctx.config.kernel_config);
      }
      add_tiles(ctx.stats->forward_tiles, result.tiles);
      merge_pending();  // the previous tile's, on the main stream, queued behind this one
      pending = Pending{std::move(result), on_side};
    } else {
      ctx.stats->ring_steps_skipped += 1;  // the whole tile is outside the mask or window
    }
    if (shift.work) {
      arriving = shift.work;
      kv = shift.incoming;
    }
  }
  merge_pending();
  main_stream.wait_for(side_stream);  // everything the side stream did is done before the caller goes on
  return {merge.out(q.dtype()), merge.lse(), {}};
}

CpGrads ring_backward(const CpContext& ctx, dist::ProcessGroup& group, const std::vector<GroupLayout>& layouts,
                      const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                      const CpSaved& saved) {
  const int n = group.size(), me = group.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const int64_t d_qk = k.size(-1);
  const AttentionWindow window = effective_window(ctx.spec);
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor kv = travelling_kv(ctx, k, v);
  Tensor dq = zeros(q.shape(), {.dtype = acc, .device = q.device()});
  dist::WorkPtr grad_shift;
  Tensor grad_in;  // partial dK/dV of the block held next, from prev
  for (int step = 0; step < n; ++step) {
    const int src = (me - step + n) % n;
    const KvShift shift = post_kv_shift(ctx, group, layouts, kv, step);  // overlaps this step's compute
    Tensor dkv;  // this rank's contribution to block src
    if (any_visible(layouts[me], layouts[src], window)) {
      const auto [k_step, v_step] = block_kv(ctx, kv, d_qk);
      const auto grads = raw::attention_backward(dout, dlse, q, k_step, v_step, saved.out, saved.lse, ctx.spec,
                                                 pair_sequence_info(layouts[me], layouts[src]), ctx.config.kernel_config);
      add_tiles(ctx.stats->backward_tiles, grads.tiles);
      raw::add_(dq, raw::to(grads.dq, acc));
      // MLA latent: dK/dV projected through the up-projection here; only the latent's gradient travels.
      dkv = ctx.latent ? ctx.latent->project_grad(kv, grads.dk, grads.dv, acc) : raw::to(pack_kv(grads.dk, grads.dv), acc);
    } else {
      dkv = zeros(kv.shape(), {.dtype = acc, .device = kv.device()});
    }
    if (grad_shift) {
      grad_shift->wait();
      raw::add_(dkv, grad_in);  // plus what the ranks before us added
    }
    // Pass block src's gradient on: next holds it at the following step, or owns it after the last.
    grad_in = like_rows(dkv, layouts[(prev - step + n) % n].tokens(), acc);
    grad_shift = group.batch_p2p_async({dist::P2POp::send(dkv, next, kGradTag), dist::P2POp::recv(grad_in, prev, kGradTag)});
    ctx.count_sent(dkv);
    if (shift.work) {
      shift.work->wait();
      kv = shift.incoming;
    }
  }
  grad_shift->wait();  // grad_in now holds the complete gradient of this rank's own block
  if (ctx.latent) return {raw::to(dq, q.dtype()), raw::to(grad_in, k.dtype()), Tensor()};
  const auto [dk, dv] = unpack_kv(grad_in, d_qk);
  return {raw::to(dq, q.dtype()), raw::to(dk, k.dtype()), raw::to(dv, v.dtype())};
}

CpForward p2p_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  return with_sink(ctx, ring_forward(ctx, *ctx.config.group, single_rank_layouts(ctx), q, k, v));
}

CpGrads p2p_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                     const Tensor& v, const CpSaved& saved) {
  return ring_backward(ctx, *ctx.config.group, single_rank_layouts(ctx), dout, dlse, q, k, v, saved);
}

}  // namespace cpf::cp
