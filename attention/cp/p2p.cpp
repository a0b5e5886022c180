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
// padding.
//
// What travels: K and V as two messages of one batched send/receive (no packing copy before the send,
// and the received buffers go to the kernel as they are, without an unpacking copy), or the MLA latent
// (latent_kv.h), which each rank expands on use. A received block lives until the next one replaces it.
//
// Forward: one running (out, lse) pair in fp32 (lse_merge.h) that each tile's partial result updates
// in place; rows the tile saw no key for (lse -inf: the upper tile's first half) keep their values.
// Tiles alternate between two compute streams by tile computed (not by ring step: a step a window skips
// does not count), and a tile is merged after the next one was queued.
//
// Backward replays the ring: each rank adds its tile's dK/dV to the partial sum of the block it holds
// and passes the sum on one hop behind the KV, so after P steps every rank has received the complete
// gradient of its own block. The sum travels in the inputs' dtype (bf16 in training): each hop adds
// its tile's dK/dV to the received sum element-wise in fp32 and rounds once. Tile gradients use the merged
// global out and lse, so they are exact additive contributions and need no rescaling. dQ stays on the
// rank in fp32; each tile's dQ is added with cp::accumulate (lse_merge.h), read in its own dtype.
//
// Host work per pass: the P single-rank layouts and this rank's ring tiles (each step's visibility and
// pair SequenceInfo) come from the per-thread layout cache (cached_rank_layouts, cached_ring_tiles), so
// only the first pass of a batch shape builds them.
//
// Profile scopes (framework/tensor/profile.h) per step: cp/p2p/pack (posting the shift: receive
// buffers, the sends), cp/p2p/wait (the compute stream waiting for the block), cp/p2p/tile,
// cp/p2p/merge; and cp/p2p/backward/{pack, wait, tile} (backward pack: adding and converting the
// travelling dK/dV, posting both shifts).
#include "attention/cp/layout_cache.h"
#include "attention/cp/lse_merge.h"
#include "attention/cp/strategy.h"
#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"

#include <optional>

namespace cpf::cp {
namespace {

// Distinct tags per message kind: the KV shift and the gradient shift of the backward are in flight
// together between the same two ranks.
constexpr int kKTag = 0;
constexpr int kVTag = 1;
constexpr int kGradKTag = 2;
constexpr int kGradVTag = 3;

// A block of the ring: K (T, Hkv, Dqk) and V (T, Hkv, Dv), or the MLA latent (T, 1, r + rope) in k
// with v undefined; and in the backward, their (partial) gradients.
struct Block {
  Tensor k, v;
};

Block travelling_block(const CpContext& ctx, const Tensor& k, const Tensor& v) {
  return {k, ctx.latent ? Tensor() : v};
}

std::pair<Tensor, Tensor> block_kv(const CpContext& ctx, const Block& block) {
  return ctx.latent ? ctx.latent->expand(block.k) : std::pair<Tensor, Tensor>{block.k, block.v};
}

Tensor like_rows(const Tensor& t, int64_t rows) {
  Shape shape = t.shape();
  shape[0] = rows;
  return empty(shape, {.dtype = t.dtype(), .device = t.device()});
}

void add_tiles(TileStats& into, const TileStats& tiles) {
  into.full += tiles.full;
  into.partial += tiles.partial;
  into.skipped += tiles.skipped;
}

// One ring shift: `out` goes to the next rank while a block of `rows` rows (out's dtypes and trailing
// dims) arrives from the previous one, as one batched operation (two messages per block).
struct Shift {
  dist::WorkPtr work;
  Block incoming;
};

Shift post_shift(const CpContext& ctx, dist::ProcessGroup& group, const Block& out, int64_t rows, int k_tag,
                 int v_tag) {
  const int n = group.size(), me = group.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  Block in{like_rows(out.k, rows), out.v.defined() ? like_rows(out.v, rows) : Tensor()};
  std::vector<dist::P2POp> ops{dist::P2POp::send(out.k, next, k_tag)};
  if (out.v.defined()) ops.push_back(dist::P2POp::send(out.v, next, v_tag));
  ops.push_back(dist::P2POp::recv(in.k, prev, k_tag));
  if (in.v.defined()) ops.push_back(dist::P2POp::recv(in.v, prev, v_tag));
  ctx.count_sent(out.k);
  if (out.v.defined()) ctx.count_sent(out.v);
  return {group.batch_p2p_async(ops), std::move(in)};
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

// Step src's pair info: the cached one (no copy), or one made into `made`.
const SequenceInfo& pair_of(const std::vector<RingTile>* tiles, const std::vector<GroupLayout>& layouts, int me,
                            int src, std::optional<SequenceInfo>& made) {
  if (tiles != nullptr) return (*tiles)[static_cast<size_t>(src)].pair;
  return made.emplace(pair_sequence_info(layouts[static_cast<size_t>(me)], layouts[static_cast<size_t>(src)]));
}

// The P single-rank layouts, from the per-thread layout cache: every layer's pass of a batch shape
// after the first costs one key comparison instead of P layout builds.
std::shared_ptr<const std::vector<GroupLayout>> single_rank_layouts(const CpContext& ctx) {
  return cached_rank_layouts(ctx.global, ctx.cp_size);
}

// The forward's tiles on two compute streams, merged on the main one into `merge` (see the top).
class ForwardTiles {
 public:
  ForwardTiles(const CpContext& ctx, const Device& device, PartialMerge& merge)
      : ctx_(ctx),
        merge_(merge),
        main_(DeviceStream::current(device)),
        side_(ctx.streams == 2 ? ring_side_stream(device) : main_) {
    side_.wait_for(main_);  // q, k, v are ready there
  }

  // The stream the next computed tile runs on.
  const DeviceStream& next_stream() const { return computed_ % 2 == 1 && !(side_ == main_) ? side_ : main_; }

  void compute(const Tensor& q, const Block& block, const SequenceInfo& pair) {
    const DeviceStream& stream = next_stream();
    const bool on_side = &stream == &side_;
    ++computed_;
    raw::AttentionForward result;
    {
      const DeviceStreamScope scope(stream);
      const profile::Scope tile("cp/p2p/tile");
      const auto [k_step, v_step] = block_kv(ctx_, block);
      result = raw::attention_forward(q, k_step, v_step, ctx_.spec, pair, ctx_.config.kernel_config);
    }
    add_tiles(ctx_.stats->forward_tiles, result.tiles);
    merge_pending();  // the previous tile's, on the main stream, queued behind this one
    pending_ = Pending{std::move(result), on_side};
  }

  // Merges the last tile; everything the side stream did is done before the caller goes on.
  void finish() {
    merge_pending();
    main_.wait_for(side_);
  }

 private:
  struct Pending {
    raw::AttentionForward result;
    bool on_side = false;
  };

  void merge_pending() {
    if (!pending_) return;
    const profile::Scope scope("cp/p2p/merge");
    if (pending_->on_side) {
      main_.wait_for(side_);
      main_.record_use(pending_->result.out);  // side-stream memory read by the merge
      main_.record_use(pending_->result.lse);
    }
    merge_.add(pending_->result.out, pending_->result.lse);
    pending_.reset();
  }

  const CpContext& ctx_;
  PartialMerge& merge_;
  DeviceStream main_;
  DeviceStream side_;
  std::optional<Pending> pending_;
  int computed_ = 0;  // tiles computed so far: they alternate, whichever steps a window skips
};

}  // namespace

CpForward ring_forward(const CpContext& ctx, dist::ProcessGroup& group, const std::vector<GroupLayout>& layouts,
                       const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<RingTile>* tiles_of) {
  const int n = group.size(), me = group.rank();
  const AttentionWindow window = effective_window(ctx.spec);
  Block block = travelling_block(ctx, k, v);
  PartialMerge merge(q.size(0), q.size(1), ctx.value_dim(v), q.dtype(), q.device());  // (T, Hq, Dv), (Hq, T)
  ForwardTiles tiles(ctx, q.device(), merge);
  dist::WorkPtr arriving;  // the shift that brings this step's block
  for (int step = 0; step < n; ++step) {
    const int src = (me - step + n) % n;
    const bool visible = tiles_of ? (*tiles_of)[src].visible : any_visible(layouts[me], layouts[src], window);
    if (arriving) {
      // Only the stream of this step's tile waits for the transfer (on NCCL the host does not wait).
      const DeviceStream& stream = tiles.next_stream();
      const DeviceStreamScope scope(stream);
      const profile::Scope wait("cp/p2p/wait");
      arriving->wait();
      stream.record_use(block.k);
      if (block.v.defined()) stream.record_use(block.v);
    }
    Shift shift;  // overlaps this step's compute; nothing moves after the last step
    if (step + 1 < n) {
      const profile::Scope pack("cp/p2p/pack");
      shift = post_shift(ctx, group, block, layouts[(src + n - 1) % n].tokens(), kKTag, kVTag);
    }
    ctx.stats->ring_steps += 1;
    if (visible) {
      std::optional<SequenceInfo> made;
      tiles.compute(q, block, pair_of(tiles_of, layouts, me, src, made));
    } else {
      ctx.stats->ring_steps_skipped += 1;  // the whole tile is outside the mask or window
    }
    if (shift.work) {
      arriving = shift.work;
      block = std::move(shift.incoming);  // the block just used is released here
    }
  }
  tiles.finish();
  return {merge.out(q.dtype()), merge.lse(), {}};
}

namespace {

// This rank's contribution to the gradient of `block`: dK and dV as the kernel returns them (the inputs'
// dtype), or the latent's gradient in k (in `acc`: fp32, f64 for f64 inputs). Adds the tile's dq to
// `dq` (in `acc`), or starts `dq` from it when still undefined (no zero fill and no add at the first
// computed tile).
Block tile_grads(const CpContext& ctx, const Block& block, const SequenceInfo& pair, const Tensor& dout,
                 const Tensor& dlse, const Tensor& q, const CpSaved& saved, DType acc, Tensor& dq) {
  const profile::Scope tile("cp/p2p/backward/tile");
  const auto [k_step, v_step] = block_kv(ctx, block);
  const auto grads = raw::attention_backward(dout, dlse, q, k_step, v_step, saved.out, saved.lse, ctx.spec, pair,
                                             ctx.config.kernel_config);
  add_tiles(ctx.stats->backward_tiles, grads.tiles);
  if (dq.defined()) {
    accumulate(dq, grads.dq);  // a bf16 tile read as it is: no fp32 copy of it
  } else {
    dq = raw::to(grads.dq, acc);  // a fresh tensor from the kernel: the accumulator may be it
  }
  // MLA latent: dK/dV projected through the up-projection here; only the latent's gradient travels.
  if (ctx.latent) return {ctx.latent->project_grad(block.k, grads.dk, grads.dv, acc), Tensor()};
  return {grads.dk, grads.dv};
}

// The partial sum this rank passes on for a block: its own contribution `mine` (undefined when its tile
// saw nothing) plus the sum `received` from the previous rank (wire dtype; undefined at the first step),
// in the wire dtype. Same-dtype sums add element-wise in fp32 with one rounding (bf16 arithmetic in the
// raw ops); an fp32 contribution (the latent's) takes the received sum in and is converted once. No
// buffer of the block's size in fp32 is kept. `like` gives the shapes.
Block partial_sum(const Block& mine, const Block& received, const Block& like, DType wire) {
  auto one = [&](const Tensor& m, const Tensor& r, const Tensor& shape) -> Tensor {
    if (!shape.defined()) return Tensor();
    if (!m.defined()) return r.defined() ? r : zeros(shape.shape(), {.dtype = wire, .device = shape.device()});
    if (!r.defined()) return raw::to(m, wire);
    if (m.dtype() == wire) {
      raw::add_(m, r);  // into the tile's own dK or dV: no new buffer
      return m;
    }
    raw::add_(m, raw::to(r, m.dtype()));
    return raw::to(m, wire);
  };
  return {one(mine.k, received.k, like.k), one(mine.v, received.v, like.v)};
}

}  // namespace

CpGrads ring_backward(const CpContext& ctx, dist::ProcessGroup& group, const std::vector<GroupLayout>& layouts,
                      const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                      const CpSaved& saved, const std::vector<RingTile>* tiles_of) {
  const int n = group.size(), me = group.rank();
  const int prev = (me + n - 1) % n;
  const AttentionWindow window = effective_window(ctx.spec);
  const DType acc = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Block block = travelling_block(ctx, k, v);
  const DType wire = block.k.dtype();  // the gradient sums travel in the inputs' dtype
  Tensor dq;                           // (T, Hq, Dqk) in acc, from the first computed tile on
  dist::WorkPtr grad_shift;
  Block grad_in;  // the partial dK/dV of the block held now, from prev
  for (int step = 0; step < n; ++step) {
    const int src = (me - step + n) % n;
    Shift shift;  // overlaps this step's compute
    if (step + 1 < n) {
      const profile::Scope pack("cp/p2p/backward/pack");
      shift = post_shift(ctx, group, block, layouts[(src + n - 1) % n].tokens(), kKTag, kVTag);
    }
    Block mine;  // this rank's contribution to block src
    if (tiles_of ? (*tiles_of)[src].visible : any_visible(layouts[me], layouts[src], window)) {
      std::optional<SequenceInfo> made;
      mine = tile_grads(ctx, block, pair_of(tiles_of, layouts, me, src, made), dout, dlse, q, saved, acc, dq);
    }
    if (grad_shift) {
      const profile::Scope wait("cp/p2p/backward/wait");
      grad_shift->wait();
    }
    {
      // Pass block src's gradient on: next holds it at the following step, or owns it after the last.
      const profile::Scope pack("cp/p2p/backward/pack");
      const Block out = partial_sum(mine, grad_in, block, wire);
      Shift grads = post_shift(ctx, group, out, layouts[(prev - step + n) % n].tokens(), kGradKTag, kGradVTag);
      grad_shift = grads.work;
      grad_in = std::move(grads.incoming);
    }
    if (shift.work) {
      const profile::Scope wait("cp/p2p/backward/wait");
      shift.work->wait();
      block = std::move(shift.incoming);
    }
  }
  grad_shift->wait();  // grad_in now holds the complete gradient of this rank's own block
  if (!dq.defined()) dq = zeros(q.shape(), {.dtype = acc, .device = q.device()});  // no tile saw a key
  if (ctx.latent) return {raw::to(dq, q.dtype()), raw::to(grad_in.k, k.dtype()), Tensor()};
  return {raw::to(dq, q.dtype()), raw::to(grad_in.k, k.dtype()), raw::to(grad_in.v, v.dtype())};
}

// The layouts and this rank's ring tiles both come from the per-thread caches (layout_cache.h): after
// the first layer of a batch shape, a pass makes no layout, visibility or pair info.
CpForward p2p_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  const auto layouts = single_rank_layouts(ctx);
  const auto tiles = cached_ring_tiles(layouts, ctx.config.group->rank(), effective_window(ctx.spec));
  return with_sink(ctx, ring_forward(ctx, *ctx.config.group, *layouts, q, k, v, tiles.get()));
}

CpGrads p2p_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                     const Tensor& v, const CpSaved& saved) {
  const auto layouts = single_rank_layouts(ctx);
  const auto tiles = cached_ring_tiles(layouts, ctx.config.group->rank(), effective_window(ctx.spec));
  return ring_backward(ctx, *ctx.config.group, *layouts, dout, dlse, q, k, v, saved, tiles.get());
}

}  // namespace cpf::cp
