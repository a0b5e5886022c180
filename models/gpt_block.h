#pragma once
// One pre-norm transformer block of the GPT (models/gpt.h):
//
//   x (T, C) -> x + attn(attn_norm(x)) -> h + mlp(mlp_norm(h))
//
// Mixed precision (GPTOptions::compute_dtype): x and the norms stay in the parameter dtype; each
// sub-block runs on its normalised input converted to the compute dtype and hands back its output
// converted to the parameter dtype, so the residual sums accumulate in f32.
//
// Parameter names: attn_norm.*, attn.* (q_proj, k_proj, ... of the attention module), mlp_norm.*,
// mlp.*. The block owns whichever attention module its options choose (MHA/GQA or MLA).
#include <functional>
#include <memory>

#include "attention/modules/multi_head_attention.h"
#include "attention/modules/multi_head_latent_attention.h"
#include "models/gpt.h"

namespace cpf::models {

// A norm module (RMSNorm or LayerNorm) and the function applying it.
struct NormLayer {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&)> apply;
};
NormLayer make_norm(const GPTOptions& options);

// Overwrites `weight` with normal(0, std) draws from `gen` (the scaled init of residual projections).
void reinit_normal(const Tensor& weight, double std, Generator* gen);

class GPTBlock : public nn::Module {
 public:
  GPTBlock(const GPTOptions& options, Generator* gen);
  // x (T, C) -> (T, C); seq and cp as for GPT::forward.
  Tensor forward(const Tensor& x, const SequenceInfo& seq, const cp::ContextParallel* cp) const;
  // Incremental decoding: x (T_new, C) holds `step`'s new tokens; `cache` is this block's (kv_cache.h).
  Tensor forward_cached(const Tensor& x, const nn::KVCacheStep& step, nn::KVCache& cache) const;

 private:
  nn::Precision precision_;
  NormLayer attn_norm_, mlp_norm_;
  std::shared_ptr<nn::MultiHeadAttention> mha_;
  std::shared_ptr<nn::MultiHeadLatentAttention> mla_;
  std::shared_ptr<nn::MLP> mlp_;
};

}  // namespace cpf::models
