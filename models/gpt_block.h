#pragma once
// One pre-norm transformer block of the GPT (models/gpt.h):
//
//   x (T, C) -> x + attn(attn_norm(x)) -> h + mlp(mlp_norm(h))
//
// Each residual add is fused with the norm that follows it (framework/tensor/ops/add_norm.h): the block
// adds the previous block's MLP output inside attn_norm and its attention output inside mlp_norm, and
// hands its own MLP output on, unadded (BlockOutput).
//
// Mixed precision (GPTOptions::compute_dtype): x and the norms stay in the parameter dtype; each
// sub-block runs on its normalised input, which the fused norm writes in the compute dtype, and its
// output (compute dtype) is widened inside the next fused add, so the residual sums accumulate in f32.
//
// Parameter names: attn_norm.*, attn.* (q_proj, k_proj, ... of the attention module), mlp_norm.*,
// mlp.*. The block owns whichever attention module its options choose (MHA/GQA or MLA).
#include <functional>
#include <memory>

#include "attention/nn/multi_head_attention.h"
#include "attention/nn/multi_head_latent_attention.h"
#include "framework/autograd/functions/add_norm.h"
#include "models/gpt.h"

namespace cpf::models {

// A norm module (RMSNorm or LayerNorm) and its fused form: (x, branch, out_dtype) -> {x + branch, norm(x +
// branch) in out_dtype}; an undefined branch normalises x alone (nn::LayerNorm::forward_add).
using AddNormFn = std::function<AddNormOutput(const Tensor&, const Tensor&, DType)>;
struct NormLayer {
  std::shared_ptr<nn::Module> module;
  AddNormFn add;
};
NormLayer make_norm(const GPTOptions& options);

// Overwrites `weight` with normal(0, std) draws from `gen` (the scaled init of residual projections).
void reinit_normal(const Tensor& weight, double std, Generator* gen);

// What a block hands on: the residual stream and its MLP output, not yet added (x + mlp is the block's
// output). The next block adds it inside its attn_norm (one fused kernel), the last one in final_norm.
struct BlockOutput {
  Tensor x;        // (T, C) parameter dtype
  Tensor pending;  // (T, C) compute dtype
};

class GPTBlock : public nn::Module {
 public:
  GPTBlock(const GPTOptions& options, Generator* gen);
  // x (T, C) and the previous block's pending MLP output (undefined for the first block): the block
  // computes x + pending, then its attention and MLP; seq and cp as for GPT::forward.
  BlockOutput forward(const Tensor& x, const Tensor& pending, const SequenceInfo& seq,
                      const cp::ContextParallel* cp) const;
  // Incremental decoding: x (T_new, C) holds `step`'s new tokens; `cache` is this block's (kv_cache.h).
  BlockOutput forward_cached(const Tensor& x, const Tensor& pending, const nn::KVCacheStep& step,
                             nn::KVCache& cache) const;

 private:
  nn::Precision precision_;
  NormLayer attn_norm_, mlp_norm_;
  std::shared_ptr<nn::MultiHeadAttention> mha_;
  std::shared_ptr<nn::MultiHeadLatentAttention> mla_;
  std::shared_ptr<nn::MLP> mlp_;
};

}  // namespace cpf::models
