#pragma once
// context_parallel_attention: dot_product_attention over a sequence sharded across a CP group.
//
// Every rank passes its own shard of q, k, v in the load-balanced dual-chunk layout (sharding.h:
// rank r holds chunks r and 2P-1-r of every sequence), tagged as such (sharded_tensor.h: the API takes
// ShardedTensor only, and refuses q, k, v cut differently) and the GLOBAL sequence metadata (the
// SequenceInfo of the unsharded batch; thd needs cu_seqlens and cu_seqlens_padded, every padded
// length a multiple of 2P; explicit positions, with gaps or offsets, are honoured by every
// strategy). Each rank gets out, lse for its own tokens, equal to the single-rank result on that
// shard, and gradients for its shard.
//
// Strategies (cp_comm_type), one file each:
//   p2p         ring: KV travels around the CP group, partial results merge by LSE   (p2p.cpp)
//   all_gather  all-gather KV, attend the local queries to it, reduce-scatter dKV    (all_gather.cpp)
//   a2a         Ulysses: all-to-all from sequence split to head split and back       (a2a.cpp)
//   a2a+p2p     Ulysses inside the a2a sub-group, ring across the p2p sub-group       (a2a_p2p.cpp)
// Every strategy accepts every format (bshd, sbhd, thd), mask, sliding window, GQA/MQA and MLA, or
// rejects the combination up front with a reason (cp_support.h; docs/cp.md).
#include <memory>
#include <optional>
#include <string>

#include "attention/cp/latent_kv.h"
#include "attention/cp/sharded_tensor.h"
#include "attention/dot_product_attention.h"
#include "framework/distributed/process_group.h"

namespace cpf::cp {

enum class CommType : uint8_t { p2p, all_gather, a2a, a2a_p2p };
std::string comm_type_name(CommType type);  // "p2p", "all_gather", "a2a", "a2a+p2p"
CommType parse_comm_type(const std::string& name);

struct ContextParallel {
  CommType comm_type = CommType::p2p;
  dist::ProcessGroupPtr group;      // the CP group (size P > 1)
  dist::ProcessGroupPtr a2a_group;  // a2a+p2p: this rank's a2a sub-group (consecutive CP ranks)
  dist::ProcessGroupPtr p2p_group;  // a2a+p2p: this rank's p2p sub-group
  AttentionKernelConfig
      kernel_config;  // kernel choice (backend, deterministic) of every attention call the strategy makes
  // Ring forward (p2p, a2a+p2p): 2 = tiles alternate between two compute streams so neighbours can
  // overlap (docs/cp.md, "On GPUs"), 1 = one stream. Devices that run in order (the CPU) have one either way.
  int compute_streams = 2;
  // MLA modules under p2p, all_gather, a2a+p2p: move the latent instead of the expanded K/V (latent_kv.h;
  // attention.cp_mla_latent). `automatic` lets choose_mla_latent decide per call shape.
  MlaLatentMode mla_latent = MlaLatentMode::automatic;
  // a2a, a2a+p2p: the all-to-alls pipelined with attention by head groups (the exchange of group i+1
  // runs while group i attends; docs/cp.md, "a2a"). 0 = automatic (choose_a2a_head_groups), else
  // the count, which must divide the query and KV heads each rank attends.
  int a2a_head_groups = 0;
};

// Why `head_groups` (> 0) cannot split the `q_heads` query and `kv_heads` KV heads each rank attends after
// the all-to-all (KV heads replicated up to the a2a size first), as a sentence that follows
// "a2a_head_groups=N "; empty when it can. The strategies and `cpformer check-config` both use it.
std::string a2a_head_groups_problem(int64_t head_groups, int64_t q_heads, int64_t kv_heads);

// What one call did, for tests, benchmarks and docs (bytes are what this rank sent).
struct CpStats {
  int64_t forward_bytes_sent = 0;
  int64_t backward_bytes_sent = 0;
  TileStats forward_tiles;
  TileStats backward_tiles;
  int64_t ring_steps = 0;          // forward ring steps (p2p, a2a+p2p)
  int64_t ring_steps_skipped = 0;  // steps whose whole tile was outside the mask/window: no compute
};

// `t` tagged as this rank's dual-chunk shard of cp.group, on the caller's word: for code whose inputs were
// cut that way upstream (the attention modules: a model's batches are cut by models/data/cp_shard.h, and
// q, k, v come from the same rows). Throws when cp.group is null.
ShardedTensor dual_chunk_of(const Tensor& t, const ContextParallel& cp);

// Differentiable in q, k, v (through out and lse). `stats`, when given, is filled by the forward and,
// later, the backward (it must outlive the backward). Each input carries how its tokens were cut
// (sharded_tensor.h): q, k and v must all be dual-chunk shards for this rank of cp.group, or the call is
// refused before any communication with a message naming the sharding of q, k and v. A tensor cut by
// cp::shard_sequence / cp::shard_tokens is tagged with cp::dual_chunk_shard (or
// ShardedTensor{t, Sharding::dual_chunk(P, rank)} where the caller cut it itself); there is no entry
// taking plain tensors, so a K/V cut another way with Q's shapes cannot go through unnoticed.
AttentionOutput context_parallel_attention(const ShardedTensor& q, const ShardedTensor& k, const ShardedTensor& v,
                                           const AttentionSpec& spec, const std::optional<SequenceInfo>& seq,
                                           const ContextParallel& cp, std::shared_ptr<CpStats> stats = nullptr);

// MLA with latent-KV communication (p2p, all_gather, a2a+p2p; latent_kv.h): q (.., H, nope + rope) as above and
// the latent (.., 1, kv_lora_rank + rope) = [normalised c_kv | rotated k_pe] of this rank's tokens in
// q's layout, both dual-chunk shards as above; K and V are expanded from it with kv_b_weight
// (H (nope + d_v), kv_lora_rank) and kv_b_bias (or undefined) wherever a block is used. Differentiable in
// q, the latent, the weight, the bias and spec.sink; the weight's gradient covers the blocks this rank
// computed (the world's gradient all-reduce sums it). Equal to context_parallel_attention on the expanded
// K and V.
AttentionOutput context_parallel_mla_attention(const ShardedTensor& q, const ShardedTensor& latent,
                                               const Tensor& kv_b_weight, const Tensor& kv_b_bias,
                                               const MlaLatentShape& shape, const AttentionSpec& spec,
                                               const std::optional<SequenceInfo>& seq, const ContextParallel& cp,
                                               std::shared_ptr<CpStats> stats = nullptr);

}  // namespace cpf::cp
