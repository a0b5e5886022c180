#pragma once
// Runs one attention problem twice: on the full sequence on one rank (the reference) and sharded
// over a thread CP group; returns both results on every rank's shard for comparison.
#include <mutex>
#include <optional>
#include <vector>

#include "attention/cp/context_parallel.h"
#include "attention/cp/sharding.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/device_mesh.h"
#include "framework/distributed/launcher.h"
#include "framework/tensor/ops/views.h"
#include "support/test_utils.h"

namespace cpf::cp::testing {

// Positions of the global problem's tokens: the default (index within the slot), segment positions
// with gaps (segment_pos = 2i), q and kv offsets (with_position_offsets(3, 0): every query sees three
// tokens further, the bottom-right form of docs/attention.md), or per-sequence offsets (sequence n's
// queries shifted by n against its keys).
enum class Positions : uint8_t { slot_index, gapped, offsets, sequence_offsets };

struct CpCase {
  CommType comm = CommType::p2p;
  int cp = 2;
  int a2a = 1;  // a2a+p2p
  QkvFormat format = QkvFormat::bshd;
  MaskType mask = MaskType::causal;
  AttentionWindow window;
  int64_t heads = 4, kv_heads = 4, d_qk = 8, d_v = 8;
  int64_t batch = 2;
  int64_t seq = 16;  // bshd/sbhd global length (multiple of 2*cp)
  // thd real lengths (padded to multiples of 2*cp)
  std::vector<int64_t> thd_lengths{5, 16, 1, 11};
  DType dtype = DType::f32;
  uint64_t seed = 7;
  // Explicit positions on the global SequenceInfo (the single-rank reference uses the same ones).
  Positions positions = Positions::slot_index;
  // An attention sink (one learnable logit per query head, spec.sink) on both sides.
  bool sink = false;
  // a2a, a2a+p2p: ContextParallel::a2a_head_groups (0 = automatic).
  int a2a_head_groups = 0;
};

struct Tensors {
  Tensor out, lse, dq, dk, dv;
  Tensor dsink;  // CpCase::sink: the reference's d(sink), or this rank's share of it
};

// Global problem: full tensors, sequence info, upstream gradients.
struct Global {
  Tensor q, k, v, dout, dlse;
  Tensor sink;  // (heads) f32 (f64 for f64 cases) when CpCase::sink
  std::optional<SequenceInfo> seq;
  std::vector<int64_t> cu, cu_padded;  // thd
  int64_t seq_dim = 1;                 // bshd 1, sbhd 0, thd 0
};

// The global SequenceInfo with c.positions applied (bshd/sbhd without one: one whole sequence per row).
inline SequenceInfo with_explicit_positions(const CpCase& c, std::optional<SequenceInfo> seq) {
  if (!seq) seq = SequenceInfo::from_lengths(std::vector<int64_t>(static_cast<size_t>(c.batch), c.seq), c.seq);
  if (c.positions == Positions::offsets) return seq->with_position_offsets(3, 0);
  if (c.positions == Positions::sequence_offsets) {
    std::vector<int64_t> q_offsets;
    for (int64_t n = 0; n < seq->num_sequences(); ++n) q_offsets.push_back(n);
    return seq->with_position_offsets(q_offsets, std::vector<int64_t>(q_offsets.size(), 0));
  }
  std::vector<int64_t> q = seq->resolved_q_positions(), kv = seq->resolved_kv_positions();
  for (int64_t& p : q) p *= 2;
  for (int64_t& p : kv) p *= 2;
  return seq->with_positions(q, kv);
}

inline Global make_global(const CpCase& c) {
  Global g;
  auto shape = [&](int64_t heads, int64_t dim, int64_t tokens) -> Shape {
    switch (c.format) {
      case QkvFormat::bshd: return {c.batch, tokens, heads, dim};
      case QkvFormat::sbhd: return {tokens, c.batch, heads, dim};
      case QkvFormat::thd: return {tokens, heads, dim};
    }
    return {};
  };
  int64_t tokens = c.seq;
  if (c.format == QkvFormat::thd) {
    g.cu = {0};
    for (int64_t len : c.thd_lengths) g.cu.push_back(g.cu.back() + len);
    g.cu_padded = pad_cu_seqlens(g.cu, c.cp);
    tokens = g.cu_padded.back();
    g.seq = SequenceInfo::from_cu_seqlens(g.cu, g.cu_padded);
    g.seq_dim = 0;
  } else {
    g.seq_dim = c.format == QkvFormat::bshd ? 1 : 0;
    if (is_padding(c.mask)) {
      std::vector<int64_t> lengths;
      for (int64_t b = 0; b < c.batch; ++b) lengths.push_back(b == 0 ? c.seq - 3 : c.seq / 2 + 1);
      g.seq = SequenceInfo::from_lengths(lengths, c.seq);
    }
  }
  if (c.positions != Positions::slot_index) g.seq = with_explicit_positions(c, g.seq);
  g.q = ::cpf::testing::random_tensor(shape(c.heads, c.d_qk, tokens), c.dtype, c.seed);
  g.k = ::cpf::testing::random_tensor(shape(c.kv_heads, c.d_qk, tokens), c.dtype, c.seed + 1);
  g.v = ::cpf::testing::random_tensor(shape(c.kv_heads, c.d_v, tokens), c.dtype, c.seed + 2);
  g.dout = ::cpf::testing::random_tensor(shape(c.heads, c.d_v, tokens), c.dtype, c.seed + 3);
  const Shape lse_shape = c.format == QkvFormat::thd ? Shape{c.heads, tokens} : Shape{c.batch, c.heads, tokens};
  g.dlse = ::cpf::testing::random_tensor(lse_shape, c.dtype == DType::f64 ? DType::f64 : DType::f32, c.seed + 4);
  if (c.sink) {
    g.sink =
        ::cpf::testing::random_tensor({c.heads}, c.dtype == DType::f64 ? DType::f64 : DType::f32, c.seed + 5, -2, 2);
  }
  return g;
}

inline AttentionSpec spec_of(const CpCase& c) {
  AttentionSpec spec;
  spec.qkv_format = c.format;
  spec.mask = c.mask;
  spec.window = c.window;
  return spec;
}

// out/lse/dq/dk/dv of the full problem on one rank.
inline Tensors reference(const CpCase& c, const Global& g) {
  Tensor q = raw::clone(g.q).set_requires_grad(), k = raw::clone(g.k).set_requires_grad(),
         v = raw::clone(g.v).set_requires_grad();
  AttentionSpec spec = spec_of(c);
  Tensor sink;
  if (g.sink.defined()) spec.sink = sink = raw::clone(g.sink).set_requires_grad();
  auto [out, lse] = dot_product_attention(q, k, v, spec, g.seq);
  backward({out, lse}, {g.dout, raw::to(g.dlse, lse.dtype())});
  return {out.detach(), lse.detach(), q.grad(), k.grad(), v.grad(), sink.defined() ? sink.grad() : Tensor()};
}

// A rank's shard of a global tensor along the token dimension.
inline Tensor shard(const CpCase& c, const Global& g, const Tensor& t, int64_t dim, int rank) {
  if (c.format == QkvFormat::thd) {
    const ThdShard info = thd_shard(g.cu, g.cu_padded, c.cp, rank);
    if (dim == 0) return shard_tokens(t, info);
    return raw::contiguous(raw::transpose(shard_tokens(raw::contiguous(raw::transpose(t, 0, dim)), info), 0, dim));
  }
  return shard_sequence(t, dim, c.cp, rank);
}

// A rank's q, k or v shard, tagged dual-chunk by the function that cut it (sharded_tensor.h).
inline ShardedTensor sharded_input(const CpCase& c, const Global& g, const Tensor& t, int rank) {
  if (c.format == QkvFormat::thd) return dual_chunk_shard(t, thd_shard(g.cu, g.cu_padded, c.cp, rank));
  return dual_chunk_shard(t, g.seq_dim, c.cp, rank);
}

// Runs the CP problem; returns per-rank results and the per-rank stats.
inline std::vector<Tensors> run_cp(const CpCase& c, const Global& g, std::vector<CpStats>* stats_out = nullptr) {
  std::vector<Tensors> results(static_cast<size_t>(c.cp));
  std::vector<CpStats> stats(static_cast<size_t>(c.cp));
  const int64_t lse_dim = c.format == QkvFormat::thd ? 1 : 2;
  dist::launch(c.cp,
               [&](dist::RankContext& rc) {
                 dist::MeshShape shape;
                 shape.cp = c.cp;
                 if (c.comm == CommType::a2a_p2p) {
                   shape.cp_a2a = c.a2a;
                   shape.hierarchical_cp = true;
                 }
                 shape.require_cp = true;
                 dist::DeviceMesh mesh(rc.world, shape);
                 ContextParallel cp{c.comm, mesh.cp(), mesh.cp_a2a(), mesh.cp_p2p()};
                 cp.a2a_head_groups = c.a2a_head_groups;
                 const int r = rc.rank;
                 ShardedTensor q = sharded_input(c, g, g.q, r), k = sharded_input(c, g, g.k, r),
                               v = sharded_input(c, g, g.v, r);
                 for (ShardedTensor* t : {&q, &k, &v}) t->tensor.set_requires_grad();
                 auto st = std::make_shared<CpStats>();
                 AttentionSpec spec = spec_of(c);
                 Tensor sink;
                 if (g.sink.defined()) spec.sink = sink = raw::clone(g.sink).set_requires_grad();
                 auto [out, lse] = context_parallel_attention(q, k, v, spec, g.seq, cp, st);
                 backward({out, lse},
                          {shard(c, g, g.dout, g.seq_dim, r), raw::to(shard(c, g, g.dlse, lse_dim, r), lse.dtype())});
                 results[r] = {out.detach(),    lse.detach(),    q.tensor.grad(),
                               k.tensor.grad(), v.tensor.grad(), sink.defined() ? sink.grad() : Tensor()};
                 stats[r] = *st;
               },
               {.timeout = std::chrono::milliseconds(60'000)});
  if (stats_out) *stats_out = stats;
  return results;
}

}  // namespace cpf::cp::testing
