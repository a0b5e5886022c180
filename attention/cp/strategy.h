#pragma once
// Internal interface between context_parallel_attention (validation, format conversion, autograd)
// and the strategies. Tensors here are in thd form on this rank's local storage (layout.h):
// q (T, Hq, Dqk), k (T, Hkv, Dqk), v (T, Hkv, Dv), out (T, Hq, Dv), lse (Hq, T), all contiguous.
#include <functional>
#include <vector>

#include "attention/cp/context_parallel.h"
#include "attention/cp/latent_kv.h"
#include "attention/cp/layout.h"
#include "attention/cp/layout_cache.h"

namespace cpf::cp {

struct CpContext {
  AttentionSpec spec;      // thd spec: mask, window, scale; heads/dims left to the tensors
  GlobalSequences global;  // the batch's real and padded cumulative lengths
  int64_t cp_size = 1;
  int cp_rank = 0;
  ContextParallel config;  // the caller's CP configuration: comm type, groups, kernel config, streams, latent mode
  std::vector<int> cp_rank_of_global;  // global rank -> CP rank (-1 outside the group)
  CpStats* stats = nullptr;            // never null inside a strategy
  bool backward = false;               // counts bytes into the backward figures when set
  int streams = 2;                     // ContextParallel::compute_streams
  // The attention sink (Hq) of the call, or undefined. ctx.spec never carries it (every tile and ring
  // step runs without it); each strategy applies it once to its merged rows with with_sink().
  Tensor sink;
  // MLA latent-KV communication (latent_kv.h; p2p, all_gather, a2a+p2p): when set, the strategies' `k` is the
  // latent (T, 1, kv_lora_rank + rope), `v` is undefined, blocks are expanded where they are used, and
  // the backward returns the latent's gradient in CpGrads::dk (dv undefined).
  std::shared_ptr<const LatentKv> latent;

  // d_v of the call: v's head dim, or the latent's v_head_dim.
  int64_t value_dim(const Tensor& v) const { return latent ? latent->shape().v_head_dim : v.size(-1); }
  // This rank's own storage as a layout (one member).
  GroupLayout own_layout() const { return make_group_layout(global, cp_size, {cp_rank}); }
  // CP ranks of the members of a sub-group, in the sub-group's rank order.
  std::vector<int> cp_ranks_of(const dist::ProcessGroup& group) const;
  // Adds nbytes(t) * times * numerator / denominator to this pass's byte count.
  void count_sent(const Tensor& t, int64_t times = 1, int64_t numerator = 1, int64_t denominator = 1) const;
};

struct CpForward {
  Tensor out;                 // (T, Hq, Dv), q's dtype
  Tensor lse;                 // (Hq, T), f32 (f64 for f64 inputs)
  std::vector<Tensor> extra;  // strategy state kept for the backward (e.g. Ulysses head-split tensors)
};

struct CpGrads {
  Tensor dq, dk, dv;
};

// The saved forward state each backward needs besides q, k, v.
struct CpSaved {
  Tensor out, lse;
  std::vector<Tensor> extra;
};

CpForward p2p_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v);
CpGrads p2p_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                     const Tensor& v, const CpSaved& saved);

CpForward all_gather_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v);
CpGrads all_gather_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q,
                            const Tensor& k, const Tensor& v, const CpSaved& saved);

CpForward a2a_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v);
CpGrads a2a_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                     const Tensor& v, const CpSaved& saved);

CpForward a2a_p2p_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v);
CpGrads a2a_p2p_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                         const Tensor& v, const CpSaved& saved);

// ---- shared building blocks ----

// `forward` with ctx.sink in every row's denominator (attention_sink.h), for merged rows holding
// query heads [first_head, first_head + heads) (a Ulysses head slice starts past 0). No-op without a sink.
CpForward with_sink(const CpContext& ctx, CpForward forward, int64_t first_head = 0);

// The ring over `group`: member j of the group holds storage layouts[j] (sequence-major); q, k, v
// are in layouts[group.rank()]. Used by p2p (one rank per member) and a2a+p2p (one a2a group per
// member). lse of the result is (Hq, T). `tiles`, when given, is cached_ring_tiles(layouts,
// group.rank(), the spec's window) (layout_cache.h): the steps' visibility and pair infos are then
// read from it instead of being made again.
CpForward ring_forward(const CpContext& ctx, dist::ProcessGroup& group, const std::vector<GroupLayout>& layouts,
                       const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<RingTile>* tiles = nullptr);
CpGrads ring_backward(const CpContext& ctx, dist::ProcessGroup& group, const std::vector<GroupLayout>& layouts,
                      const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                      const CpSaved& saved, const std::vector<RingTile>* tiles = nullptr);

// Ulysses exchange on `group` (size A): a local (T, H, D) tensor of this member's tokens becomes
// (A*T, H/A, D) holding every member's tokens (member-major) for this member's head slice; and back.
Tensor seq_to_head_split(const CpContext& ctx, dist::ProcessGroup& group, const Tensor& local);
Tensor head_to_seq_split(const CpContext& ctx, dist::ProcessGroup& group, const Tensor& gathered);
// KV heads replicated (or not) so they split evenly over `a2a` ranks, and the inverse for gradients.
Tensor replicate_kv_heads(const Tensor& kv, int64_t a2a);
Tensor reduce_replicated_kv_heads(const Tensor& grad, int64_t num_kv_heads);

// Ulysses around an attention call on `group` (a2a.cpp): q, k, v of this rank's tokens become the
// group's tokens (sequence-major per `layout`) for this member's heads; the results go back.
CpForward ulysses_out(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                      const Tensor& out_heads, const Tensor& lse_heads);
std::pair<Tensor, Tensor> ulysses_grad_in(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                                          const Tensor& dout, const Tensor& dlse);
// Pipelined Ulysses (a2a.cpp; a2a and the a2a stage of a2a+p2p): the heads each member attends are
// split into head groups and the all-to-all of group i+1 runs while group i attends. `attend` gets one
// group's q, k, v (the group's tokens, sequence-major per `layout`, that head group) and the index of
// its first query head in the whole call (for the sink); its result's rows must hold that sink.
// forward.extra keeps q, k, v, out, lse of every head group, in order, for the backward.
using HeadGroupAttend = std::function<CpForward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t first_head)>;
using HeadGroupAttendGrad = std::function<CpGrads(const Tensor& dout, const Tensor& dlse, const Tensor* saved)>;
CpForward ulysses_pipelined_forward(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                                    const Tensor& q, const Tensor& k, const Tensor& v, int64_t head_groups,
                                    const HeadGroupAttend& attend);
// `saved` is the forward's extra (5 per head group); attend_grad gets a pointer to one group's five.
CpGrads ulysses_pipelined_backward(const CpContext& ctx, dist::ProcessGroup& group, const GroupLayout& layout,
                                   const Tensor& dout, const Tensor& dlse, const Tensor& k,
                                   const std::vector<Tensor>& saved, const HeadGroupAttendGrad& attend_grad);
// The head-group count of a call whose members each attend `q_heads` query and `kv_heads` KV heads
// (after replication) over `tokens` gathered tokens: ctx.config.a2a_head_groups when set (refused,
// naming the values, unless it divides both), else choose_a2a_head_groups.
int64_t a2a_head_groups(const CpContext& ctx, int64_t q_heads, int64_t kv_heads, int64_t tokens);
// The automatic count: 1 (no pipelining), because every split measured slower on NVLink-connected GPUs
// (docs/cp.md); set ContextParallel::a2a_head_groups to pipeline where the exchange dominates.
int64_t choose_a2a_head_groups(int64_t q_heads, int64_t kv_heads, int64_t tokens);

}  // namespace cpf::cp
