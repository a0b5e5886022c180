#pragma once
// MLA latent-KV communication for the ring (p2p, and the ring stage of a2a+p2p) and all_gather.
//
// In DeepSeek-style MLA every token's keys and values come from a small latent: the normalised
// c_kv (kv_lora_rank values) and the decoupled RoPE key (rope values), expanded per head by the
// up-projection kv_b_proj (weight W: (H (nope + d_v), kv_lora_rank), optional bias b):
//
//   [k_nope | v] = c_kv W^T + b   (split per head)      k = [k_nope | k_pe broadcast to every head]
//
// The strategies move the latent (T, 1, kv_lora_rank + rope) instead of K and V (T, H, nope + rope +
// d_v): the receiving rank expands it with the weight it holds (replicated under CP). Backward: the
// rank that computed a block's dK/dV projects them back through the up-projection,
//
//   d[k_nope | v] -> d c_kv = d[k_nope | v] W,   d k_pe = sum over heads of dk[.., nope:]
//   dW += d[k_nope | v]^T c_kv,   db += column sums of d[k_nope | v]
//
// and only the latent's gradient travels; dW and db stay with the rank that computed them (the
// world's gradient all-reduce sums them, as for every replicated weight), so they are exact.
#include <memory>
#include <optional>
#include <string>

#include "attention/sequence_info.h"
#include "framework/tensor/tensor.h"

namespace cpf::cp {

// The MLA shapes of one call.
struct MlaLatentShape {
  int64_t num_heads = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  int64_t head_dim_qk() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// attention.cp_mla_latent: whether MLA under p2p, all_gather or a2a+p2p moves the latent.
enum class MlaLatentMode : uint8_t { automatic, on, off };
std::string mla_latent_mode_name(MlaLatentMode mode);  // "auto", "on", "off"
MlaLatentMode parse_mla_latent_mode(const std::string& name);

// The `auto` rule. Both strategies post their transfers before the attention they overlap: per ring
// step (p2p, and the ring stage of a2a+p2p) one block moves while this rank's queries attend to the
// block it holds; all_gather gathers while the queries attend to their own keys. Only what a transfer
// does not hide is exposed: max(0, t_comm - t_compute) per window, and the transfers nothing follows
// (p2p's last gradient hop, all_gather's reduce-scatter) in full. The latent travels when the exposed
// time it saves exceeds its expansion's cost: per block received, the expansion forward and again in
// backward (compute dtype) and the projection of dK/dV, d c_kv and dW (fp32 accumulation, no TF32);
// the own block adds the fp32 projection less the kv_b_proj GEMM the expanded path runs on it.
struct MlaLatentChoice {
  bool latent = false;
  std::string why;
};

// One call's size, as the strategy sees it.
struct MlaLatentCall {
  bool ring = true;             // p2p or a2a+p2p's ring stage; false: all_gather
  int64_t ranks = 0;            // ranks the blocks travel between (the ring's or the gather's), >= 2
  int64_t tokens_per_rank = 0;  // tokens of one rank's block (a2a+p2p: after the all-to-all)
  double tile_pairs = 0;        // query-key pairs of one rank's queries against one block, before the mask
  int64_t element_bytes = 0;    // of the inputs; K/V, the latent and their gradients travel in it
};

// The rates the rule assumes. CUDA: 150 GB/s per direction between two CP peers (an NVLink-class
// figure; CPF_CP_LINK_GBPS sets another fabric's), 400 TFLOP/s for bf16 attention and GEMMs, 50
// TFLOP/s for fp32 GEMMs. CPU thread ranks: 10 GB/s and 100 GFLOP/s.
struct MlaLatentRates {
  double link_bytes_per_s = 0;
  double flops_per_s = 0;             // attention and GEMMs in the inputs' dtype
  double accumulate_flops_per_s = 0;  // GEMMs in the fp32 accumulation dtype
};
MlaLatentRates mla_latent_rates(const Device& device, DType dtype);
// CPF_CP_LINK_GBPS (GB/s, > 0) when set, else `fallback`; throws naming a value that is no positive number.
double cp_link_bytes_per_s(double fallback);

MlaLatentChoice choose_mla_latent(const MlaLatentShape& shape, const MlaLatentCall& call, const MlaLatentRates& rates);

// Query-key pairs of one tile: per sequence, (its padded length / ranks)^2 with `seq` (thd), else
// batch x (tokens_per_rank / batch)^2.
double mla_tile_pairs(const std::optional<SequenceInfo>& seq, int64_t tokens_per_rank, int64_t batch, int64_t ranks);

// Whether one call moves the latent. off: no; on: yes (a strategy that moves no K/V blocks then refuses
// the call, naming it); auto: when the strategy moves K/V blocks (p2p, all_gather, a2a+p2p) and
// choose_mla_latent says so for `call` at mla_latent_rates(device, dtype). auto logs its choice and
// why, once per configuration.
bool resolve_mla_latent(MlaLatentMode mode, const std::string& strategy, bool strategy_moves_kv,
                        const MlaLatentShape& shape, const MlaLatentCall& call, DType dtype, const Device& device);

// The expansion and its adjoint, on raw tensors of any device (compute dtype of the weight).
class LatentKv {
 public:
  // weight (H (nope + d_v), kv_lora_rank), bias (H (nope + d_v)) or undefined: detached values.
  LatentKv(const MlaLatentShape& shape, Tensor weight, Tensor bias);

  const MlaLatentShape& shape() const { return shape_; }
  // latent (T, 1, kv_lora_rank + rope) -> k (T, H, nope + rope), v (T, H, d_v), contiguous.
  std::pair<Tensor, Tensor> expand(const Tensor& latent) const;
  // dK/dV of the block expanded from `latent` -> the latent's gradient (T, 1, kv_lora_rank + rope) in
  // `acc`; adds this block's dW (and db) to the accumulators.
  Tensor project_grad(const Tensor& latent, const Tensor& dk, const Tensor& dv, DType acc) const;
  // The same expansion for query heads [first_head, first_head + heads) only (a Ulysses head slice): the
  // matching rows of the weight and bias, its own accumulators (fold them back with add_slice_grads).
  LatentKv head_slice(int64_t first_head, int64_t heads) const;
  // Adds a head slice's accumulated dW / db into this expansion's rows of those heads.
  void add_slice_grads(const LatentKv& slice, int64_t first_head) const;
  // The summed weight (and bias) gradients, in the weight's dtype; zeros when no block was projected.
  Tensor weight_grad() const;
  Tensor bias_grad() const;

 private:
  MlaLatentShape shape_;
  Tensor weight_, bias_;
  // Accumulated over the backward's blocks; the strategies hold the context by const reference.
  std::shared_ptr<Tensor> dweight_ = std::make_shared<Tensor>(), dbias_ = std::make_shared<Tensor>();
};

}  // namespace cpf::cp
