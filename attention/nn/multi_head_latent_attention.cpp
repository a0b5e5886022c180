#include "attention/nn/multi_head_latent_attention.h"

#include <algorithm>
#include <cmath>

#include "attention/nn/attention_layout.h"
#include "attention/nn/rope_positions_cache.h"
#include "framework/autograd/ops.h"
#include "framework/nn/precision.h"

namespace cpf::nn {
namespace {

constexpr const char* kOp = "MultiHeadLatentAttention";

// The RMSNorm scale of a latent, held as a child module so its parameter is "<name>.weight".
class LatentNorm final : public nn::Module {
 public:
  LatentNorm(int64_t size, DType dtype) { weight = register_parameter("weight", ones({size}, {.dtype = dtype})); }
  Tensor weight;
};

// The shape and size the cp_mla_latent auto rule weighs for this call: the blocks that travel
// (a2a+p2p: its ring over the p2p sub-group, each rank holding the a2a sub-group's tokens for its
// share of the heads).
std::pair<cp::MlaLatentShape, cp::MlaLatentCall> latent_call(cp::MlaLatentShape shape, const Tensor& x,
                                                             QkvFormat format, const std::optional<SequenceInfo>& seq,
                                                             const cp::ContextParallel& cp) {
  const bool hierarchical = cp.comm_type == cp::CommType::a2a_p2p && cp.a2a_group && cp.p2p_group;
  const int64_t a2a = hierarchical ? cp.a2a_group->size() : 1;
  const int64_t ranks = hierarchical ? cp.p2p_group->size() : cp.group->size();
  const int64_t tokens = x.numel() / x.size(-1) * a2a;  // x: (T, C), (B, S, C) or (S, B, C)
  const int64_t batch = format == QkvFormat::thd ? 1 : x.size(format == QkvFormat::bshd ? 0 : 1);
  shape.num_heads = std::max<int64_t>(1, shape.num_heads / a2a);
  return {shape,
          {.ring = cp.comm_type != cp::CommType::all_gather,
           .ranks = ranks,
           .tokens_per_rank = tokens,
           .tile_pairs = cp::mla_tile_pairs(seq, tokens, batch, ranks),
           .element_bytes = static_cast<int64_t>(dtype_size(x.dtype()))}};
}

void check_options(const MultiHeadLatentAttentionOptions& o) {
  CPF_CHECK(o.hidden_size > 0 && o.num_heads > 0 && o.kv_lora_rank > 0 && o.qk_nope_head_dim >= 0 &&
                o.qk_rope_head_dim > 0 && o.v_head_dim > 0 && o.q_lora_rank >= 0,
            kOp, ": hidden_size, num_heads, kv_lora_rank, qk_rope_head_dim and v_head_dim must be positive, ",
            "q_lora_rank and qk_nope_head_dim >= 0: hidden_size=", o.hidden_size, " num_heads=", o.num_heads,
            " kv_lora_rank=", o.kv_lora_rank, " qk_nope_head_dim=", o.qk_nope_head_dim,
            " qk_rope_head_dim=", o.qk_rope_head_dim, " v_head_dim=", o.v_head_dim, " q_lora_rank=", o.q_lora_rank);
  CPF_CHECK(o.qk_rope_head_dim % 2 == 0, kOp,
            ": qk_rope_head_dim must be even (RoPE rotates pairs): qk_rope_head_dim=", o.qk_rope_head_dim);
}

}  // namespace

MultiHeadLatentAttention::MultiHeadLatentAttention(const MultiHeadLatentAttentionOptions& options, Generator* gen)
    : options_(options) {
  const MultiHeadLatentAttentionOptions& o = options_;
  check_options(o);
  const int64_t d_qk = o.qk_nope_head_dim + o.qk_rope_head_dim;
  spec_ = AttentionSpec{.qkv_format = o.qkv_format,
                        .mask = o.mask,
                        .window = o.window,
                        .softmax_scale = o.softmax_scale,
                        .num_heads = o.num_heads,
                        .num_kv_heads = o.num_heads,
                        .head_dim_qk = d_qk,
                        .head_dim_v = o.v_head_dim};
  check_spec(spec_);
  auto linear = [&](int64_t in, int64_t out) {
    return std::make_shared<nn::Linear>(
        nn::LinearOptions{
            .in_features = in, .out_features = out, .bias = o.bias, .init_std = o.init_std, .dtype = o.dtype},
        gen);
  };
  if (o.q_lora_rank > 0) {
    q_a_proj_ = register_module("q_a_proj", linear(o.hidden_size, o.q_lora_rank));
    auto norm = register_module("q_a_layernorm", std::make_shared<LatentNorm>(o.q_lora_rank, o.dtype));
    q_a_norm_weight_ = norm->weight;
    q_b_proj_ = register_module("q_b_proj", linear(o.q_lora_rank, o.num_heads * d_qk));
  } else {
    q_proj_ = register_module("q_proj", linear(o.hidden_size, o.num_heads * d_qk));
  }
  kv_a_proj_ = register_module("kv_a_proj_with_mqa", linear(o.hidden_size, o.kv_lora_rank + o.qk_rope_head_dim));
  auto kv_norm = register_module("kv_a_layernorm", std::make_shared<LatentNorm>(o.kv_lora_rank, o.dtype));
  kv_a_norm_weight_ = kv_norm->weight;
  kv_b_proj_ = register_module("kv_b_proj", linear(o.kv_lora_rank, o.num_heads * (o.qk_nope_head_dim + o.v_head_dim)));
  o_proj_ = register_module("o_proj", linear(o.num_heads * o.v_head_dim, o.hidden_size));
  // The spec holds the parameter's handle: in-place updates, loads and moves reach every call.
  if (o.attention_sink) spec_.sink = register_parameter("sinks", nn::sink_parameter(o.num_heads, o.dtype));
}

Tensor MultiHeadLatentAttention::project_q(const Tensor& x) const {
  if (!q_a_proj_) return q_proj_->forward(x);
  const Tensor latent = q_a_proj_->forward(x);  // (.., q_lora_rank); bf16 under mixed precision
  const Tensor weight = nn::compute_parameter(q_a_norm_weight_, latent.dtype(), kOp, "q_a_layernorm weight");
  return q_b_proj_->forward(rms_norm(latent, weight, options_.norm_eps));
}

Tensor MultiHeadLatentAttention::rotated_q(const Tensor& x, const Tensor& q_positions) const {
  const MultiHeadLatentAttentionOptions& o = options_;
  const int64_t nope = o.qk_nope_head_dim, rope_dim = o.qk_rope_head_dim;
  const Tensor q = nn::split_heads(project_q(x), o.num_heads, nope + rope_dim);  // (.., H, nope + rope)
  const std::vector<Tensor> q_parts = split(q, std::vector<int64_t>{nope, rope_dim}, -1);
  const Tensor q_pe = nn::apply_rope(q_parts[1], o.qkv_format, q_positions, {o.rope_base, o.rope_scaling}, -1);
  return nope > 0 ? cat({q_parts[0], q_pe}, -1) : q_pe;
}

std::pair<Tensor, Tensor> MultiHeadLatentAttention::latent_parts(const Tensor& x, const Tensor& kv_positions) const {
  const MultiHeadLatentAttentionOptions& o = options_;
  const std::vector<Tensor> kv_a =
      split(kv_a_proj_->forward(x), std::vector<int64_t>{o.kv_lora_rank, o.qk_rope_head_dim}, -1);
  const Tensor kv_norm = nn::compute_parameter(kv_a_norm_weight_, kv_a[0].dtype(), kOp, "kv_a_layernorm weight");
  const Tensor c_kv = rms_norm(kv_a[0], kv_norm, o.norm_eps);  // (.., kv_lora_rank)
  // One RoPE key per token, shared by every head: rotated as a single head.
  const Tensor k_pe =
      nn::apply_rope(unsqueeze(kv_a[1], -2), o.qkv_format, kv_positions, {o.rope_base, o.rope_scaling}, -1);
  return {c_kv, k_pe};  // k_pe (.., 1, rope)
}

MultiHeadLatentAttention::QKV MultiHeadLatentAttention::project_qkv(const Tensor& x, const Tensor& q_positions,
                                                                    const Tensor& kv_positions) const {
  const MultiHeadLatentAttentionOptions& o = options_;
  const int64_t nope = o.qk_nope_head_dim;
  const auto [c_kv, k_pe_one] = latent_parts(x, kv_positions);
  const Tensor kv = nn::split_heads(kv_b_proj_->forward(c_kv), o.num_heads, nope + o.v_head_dim);  // (.., H, nope + v)
  const std::vector<Tensor> kv_parts = split(kv, std::vector<int64_t>{nope, o.v_head_dim}, -1);
  Shape heads_shape = k_pe_one.shape();
  heads_shape[heads_shape.size() - 2] = o.num_heads;
  const Tensor k_pe = expand(k_pe_one, heads_shape);  // (.., H, rope)
  return {.q = rotated_q(x, q_positions), .k = nope > 0 ? cat({kv_parts[0], k_pe}, -1) : k_pe, .v = kv_parts[1]};
}

cp::MlaLatentShape MultiHeadLatentAttention::latent_shape() const {
  const MultiHeadLatentAttentionOptions& o = options_;
  return {.num_heads = o.num_heads,
          .kv_lora_rank = o.kv_lora_rank,
          .qk_nope_head_dim = o.qk_nope_head_dim,
          .qk_rope_head_dim = o.qk_rope_head_dim,
          .v_head_dim = o.v_head_dim};
}

AttentionOutput MultiHeadLatentAttention::latent_cp_attention(const Tensor& x, const Tensor& q_positions,
                                                              const Tensor& kv_positions,
                                                              const std::optional<SequenceInfo>& seq,
                                                              const cp::ContextParallel& cp) const {
  const auto [c_kv, k_pe] = latent_parts(x, kv_positions);
  const Tensor latent = cat({unsqueeze(c_kv, -2), k_pe}, -1);  // (.., 1, kv_lora_rank + rope)
  // The up-projection in the latent's dtype (a differentiable cast under mixed precision).
  const Tensor weight = nn::compute_parameter(kv_b_proj_->weight(), latent.dtype(), kOp, "kv_b_proj weight");
  const Tensor bias = kv_b_proj_->bias().defined()
                          ? nn::compute_parameter(kv_b_proj_->bias(), latent.dtype(), kOp, "kv_b_proj bias")
                          : Tensor();
  // The module's rows are this rank's dual-chunk shard (the model's batches are cut so).
  return cp::context_parallel_mla_attention(cp::dual_chunk_of(rotated_q(x, q_positions), cp),
                                            cp::dual_chunk_of(latent, cp), weight, bias, latent_shape(),
                                            nn::with_cp_sink(spec_, cp.group->size()), seq, cp);
}

Tensor MultiHeadLatentAttention::forward(const Tensor& x, const std::optional<SequenceInfo>& seq,
                                         const cp::ContextParallel* cp) const {
  const MultiHeadLatentAttentionOptions& o = options_;
  const bool use_cp = cp != nullptr && cp->group != nullptr && cp->group->size() > 1;
  nn::check_hidden(x, o.qkv_format, o.hidden_size, kOp);
  // Positions depend only on the leading (token) dims, the same for q and k: take them from x as one head.
  const Tensor x_heads = nn::split_heads(x, 1, o.hidden_size);
  auto positions = [&](bool kv) {
    // Cached per batch layout (rope_positions_cache.h): every layer after the first reuses the table.
    return use_cp ? nn::cached_rope_positions(x_heads, o.qkv_format, seq, kv, cp->group->size(), cp->group->rank())
                  : nn::cached_rope_positions(x_heads, o.qkv_format, seq, kv);
  };
  // Under p2p, all_gather and a2a+p2p the latent may travel instead of K/V (attention.cp_mla_latent).
  bool latent = false;
  if (use_cp) {
    const auto [shape, call] = latent_call(latent_shape(), x, o.qkv_format, seq, *cp);
    latent = cp::resolve_mla_latent(cp->mla_latent, cp::comm_type_name(cp->comm_type),
                                    cp->comm_type != cp::CommType::a2a, shape, call, x.dtype(), x.device());
  }
  if (latent) {
    const AttentionOutput attn = latent_cp_attention(x, positions(false), positions(true), seq, *cp);
    return o_proj_->forward(nn::merge_heads(attn.out));  // (.., C)
  }
  const QKV qkv = project_qkv(x, positions(false), positions(true));
  const AttentionOutput attn =
      use_cp ? cp::context_parallel_attention(cp::dual_chunk_of(qkv.q, *cp), cp::dual_chunk_of(qkv.k, *cp),
                                              cp::dual_chunk_of(qkv.v, *cp), nn::with_cp_sink(spec_, cp->group->size()),
                                              seq, *cp)
             : dot_product_attention(qkv.q, qkv.k, qkv.v, spec_, seq, o.kernel_config);
  return o_proj_->forward(nn::merge_heads(attn.out));  // (.., C)
}

}  // namespace cpf::nn
