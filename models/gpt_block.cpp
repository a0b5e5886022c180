#include "models/gpt_block.h"

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/rms_norm.h"

namespace cpf::models {

NormLayer make_norm(const GPTOptions& o) {
  if (o.norm == NormType::rmsnorm) {
    auto norm =
        std::make_shared<nn::RMSNorm>(nn::RMSNormOptions{.dim = o.hidden_size, .eps = o.norm_eps, .dtype = o.dtype});
    return {norm, [norm](const Tensor& x, const Tensor& b, DType out) { return norm->forward_add(x, b, out); }};
  }
  auto norm = std::make_shared<nn::LayerNorm>(
      nn::LayerNormOptions{.dim = o.hidden_size, .eps = o.norm_eps, .bias = o.bias, .dtype = o.dtype});
  return {norm, [norm](const Tensor& x, const Tensor& b, DType out) { return norm->forward_add(x, b, out); }};
}

void reinit_normal(const Tensor& weight, double std, Generator* gen) {
  NoGradGuard guard;
  copy_(weight, normal(weight.shape(), 0.0, std, {.dtype = weight.dtype()}, gen));
}

namespace {

// The parameter `name` of `module` (e.g. "o_proj.weight").
Tensor parameter(const nn::Module& module, const std::string& name) {
  for (const auto& [n, t] : module.named_parameters()) {
    if (n == name) return t;
  }
  CPF_FAIL("GPT: the attention module has no parameter '", name, "'");
}

}  // namespace

GPTBlock::GPTBlock(const GPTOptions& o, Generator* gen)
    : precision_{.param = o.dtype, .compute = o.compute_dtype.value_or(o.dtype)} {
  const double residual_std = o.init_std / std::sqrt(2.0 * static_cast<double>(o.num_layers));
  const AttentionWindow window{o.window, 0};
  attn_norm_ = make_norm(o);
  register_module("attn_norm", attn_norm_.module);
  if (o.attention == AttentionType::mla) {
    mla_ = register_module("attn", std::make_shared<nn::MultiHeadLatentAttention>(
                                       nn::MultiHeadLatentAttentionOptions{.hidden_size = o.hidden_size,
                                                                           .num_heads = o.num_heads,
                                                                           .q_lora_rank = o.q_lora_rank,
                                                                           .kv_lora_rank = o.kv_lora_rank,
                                                                           .qk_nope_head_dim = o.qk_nope_head_dim,
                                                                           .qk_rope_head_dim = o.qk_rope_head_dim,
                                                                           .v_head_dim = o.v_head_dim,
                                                                           .qkv_format = QkvFormat::thd,
                                                                           .mask = MaskType::padding_causal,
                                                                           .window = window,
                                                                           .softmax_scale = std::nullopt,
                                                                           .rope_base = o.rope_base,
                                                                           .rope_scaling = o.rope_scaling,
                                                                           .norm_eps = o.norm_eps,
                                                                           .bias = o.bias,
                                                                           .init_std = o.init_std,
                                                                           .dtype = o.dtype,
                                                                           .attention_sink = o.attention_sink,
                                                                           .kernel_config = o.kernel_config},
                                       gen));
    reinit_normal(parameter(*mla_, "o_proj.weight"), residual_std, gen);
  } else {
    mha_ = register_module("attn", std::make_shared<nn::MultiHeadAttention>(
                                       nn::MultiHeadAttentionOptions{
                                           .hidden_size = o.hidden_size,
                                           .num_heads = o.num_heads,
                                           .num_kv_heads = o.attention == AttentionType::gqa ? o.num_kv_heads : 0,
                                           .head_dim = o.head_dim,
                                           .qkv_format = QkvFormat::thd,
                                           .mask = MaskType::padding_causal,
                                           .window = window,
                                           .softmax_scale = std::nullopt,
                                           .rope = o.positions == PositionType::rope,
                                           .rope_base = o.rope_base,
                                           .rope_scaling = o.rope_scaling,
                                           .bias = o.bias,
                                           .init_std = o.init_std,
                                           .dtype = o.dtype,
                                           .attention_sink = o.attention_sink,
                                           .kernel_config = o.kernel_config},
                                       gen));
    reinit_normal(parameter(*mha_, "o_proj.weight"), residual_std, gen);
  }
  mlp_norm_ = make_norm(o);
  register_module("mlp_norm", mlp_norm_.module);
  mlp_ = register_module("mlp",
                         std::make_shared<nn::MLP>(nn::MLPOptions{.hidden_size = o.hidden_size,
                                                                  .intermediate_size = effective_intermediate_size(o),
                                                                  .activation = o.mlp,
                                                                  .bias = o.bias,
                                                                  .init_std = o.init_std,
                                                                  .out_init_std = residual_std,
                                                                  .dtype = o.dtype},
                                                   gen));
}

BlockOutput GPTBlock::forward(const Tensor& x, const Tensor& pending, const SequenceInfo& seq,
                              const cp::ContextParallel* cp) const {
  const AddNormOutput a = attn_norm_.add(x, pending, precision_.compute);                // x1 (T, C), y compute dtype
  const Tensor attn = mha_ ? mha_->forward(a.y, seq, cp) : mla_->forward(a.y, seq, cp);  // (T, C) compute dtype
  const AddNormOutput m = mlp_norm_.add(a.x1, attn, precision_.compute);
  return {m.x1, mlp_->forward(m.y)};  // (T, C) each; the MLP output is added by the next norm
}

BlockOutput GPTBlock::forward_cached(const Tensor& x, const Tensor& pending, const nn::KVCacheStep& step,
                                     nn::KVCache& cache) const {
  const AddNormOutput a = attn_norm_.add(x, pending, precision_.compute);  // (T_new, C) each
  const Tensor attn = mha_ ? mha_->forward_cached(a.y, step, cache) : mla_->forward_cached(a.y, step, cache);
  const AddNormOutput m = mlp_norm_.add(a.x1, attn, precision_.compute);
  return {m.x1, mlp_->forward(m.y)};  // (T_new, C) each
}

}  // namespace cpf::models
