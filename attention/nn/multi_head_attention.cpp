#include "attention/nn/multi_head_attention.h"

#include "attention/nn/attention_layout.h"
#include "attention/nn/rope_positions_cache.h"
#include "framework/autograd/functions/linear_cat.h"
#include "framework/autograd/ops.h"
#include "framework/nn/compute_copies.h"
#include "framework/tensor/profile.h"

namespace cpf::nn {
namespace {

constexpr const char* kOp = "MultiHeadAttention";

MultiHeadAttentionOptions resolved(MultiHeadAttentionOptions o) {
  CPF_CHECK(o.hidden_size > 0 && o.num_heads > 0, kOp,
            ": hidden_size and num_heads must be positive: hidden_size=", o.hidden_size, " num_heads=", o.num_heads);
  if (o.num_kv_heads == 0) o.num_kv_heads = o.num_heads;
  CPF_CHECK(o.num_kv_heads > 0 && o.num_heads % o.num_kv_heads == 0, kOp,
            ": num_heads must be a multiple of num_kv_heads: num_heads=", o.num_heads,
            " num_kv_heads=", o.num_kv_heads);
  if (o.head_dim == 0) {
    CPF_CHECK(o.hidden_size % o.num_heads == 0, kOp, ": hidden_size=", o.hidden_size,
              " is not a multiple of num_heads=", o.num_heads, "; set head_dim explicitly");
    o.head_dim = o.hidden_size / o.num_heads;
  }
  CPF_CHECK(o.head_dim > 0, kOp, ": head_dim must be positive: head_dim=", o.head_dim);
  if (o.rope) {
    const int64_t r = o.rotary_dim < 0 ? o.head_dim : o.rotary_dim;
    CPF_CHECK(r > 0 && r <= o.head_dim && r % 2 == 0, kOp,
              ": rotary_dim must be even and in (0, head_dim]: rotary_dim=", o.rotary_dim, " head_dim=", o.head_dim);
  }
  return o;
}

struct Projected {
  Tensor q, k, v;  // (.., H, D), (.., H_kv, D), (.., H_kv, D): views of one GEMM's output
};

// q_proj, k_proj and v_proj as one GEMM over their concatenated compute copies (linear_cat.h); the
// parameters stay three modules, so names and checkpoints are unchanged.
Projected project_qkv(const Tensor& x, const nn::Linear& q, const nn::Linear& k, const nn::Linear& v,
                      const MultiHeadAttentionOptions& o) {
  const profile::Scope scope("forward/linear", x.device());
  const std::vector<LinearWeights> weights = {q.weights_for(x), k.weights_for(x), v.weights_for(x)};
  // A decoding step's few rows: one GEMM over the kept concatenation of the three compute copies.
  const Tensor qkv =
      linear_cat(x, weights, kLinearCatMinFusedRows, nn::active_stacked_copies(x, weights));  // (.., (H + 2 H_kv) D)
  const int64_t q_width = o.num_heads * o.head_dim, kv_width = o.num_kv_heads * o.head_dim;
  const std::vector<Tensor> parts = split(qkv, std::vector<int64_t>{q_width, kv_width, kv_width}, -1);
  using nn::split_heads;
  return {split_heads(parts[0], o.num_heads, o.head_dim), split_heads(parts[1], o.num_kv_heads, o.head_dim),
          split_heads(parts[2], o.num_kv_heads, o.head_dim)};
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator* gen)
    : options_(resolved(options)) {
  const MultiHeadAttentionOptions& o = options_;
  spec_ = AttentionSpec{.qkv_format = o.qkv_format,
                        .mask = o.mask,
                        .window = o.window,
                        .softmax_scale = o.softmax_scale,
                        .num_heads = o.num_heads,
                        .num_kv_heads = o.num_kv_heads,
                        .head_dim_qk = o.head_dim,
                        .head_dim_v = o.head_dim};
  check_spec(spec_);
  auto linear = [&](int64_t in, int64_t out) {
    return std::make_shared<nn::Linear>(
        nn::LinearOptions{
            .in_features = in, .out_features = out, .bias = o.bias, .init_std = o.init_std, .dtype = o.dtype},
        gen);
  };
  q_proj_ = register_module("q_proj", linear(o.hidden_size, o.num_heads * o.head_dim));
  k_proj_ = register_module("k_proj", linear(o.hidden_size, o.num_kv_heads * o.head_dim));
  v_proj_ = register_module("v_proj", linear(o.hidden_size, o.num_kv_heads * o.head_dim));
  o_proj_ = register_module("o_proj", linear(o.num_heads * o.head_dim, o.hidden_size));
  // The spec holds the parameter's handle: in-place updates, loads and moves reach every call.
  if (o.attention_sink) spec_.sink = register_parameter("sinks", nn::sink_parameter(o.num_heads, o.dtype));
}

Tensor MultiHeadAttention::forward(const Tensor& x, const std::optional<SequenceInfo>& seq,
                                   const cp::ContextParallel* cp) const {
  const MultiHeadAttentionOptions& o = options_;
  const bool use_cp = cp != nullptr && cp->group != nullptr && cp->group->size() > 1;
  nn::check_hidden(x, o.qkv_format, o.hidden_size, kOp);
  auto [q, k, v] = project_qkv(x, *q_proj_, *k_proj_, *v_proj_, o);  // (.., H, D), (.., H_kv, D) x 2
  if (o.rope) {
    using nn::apply_rope;
    // Cached per batch layout (rope_positions_cache.h): every layer after the first reuses the table.
    auto positions = [&](const Tensor& t, bool kv) {
      return use_cp ? nn::cached_rope_positions(t, o.qkv_format, seq, kv, cp->group->size(), cp->group->rank())
                    : nn::cached_rope_positions(t, o.qkv_format, seq, kv);
    };
    const profile::Scope scope("forward/rope", x.device());
    // Self-attention: q and k come from the same tokens, so their positions differ only when the
    // SequenceInfo gives the keys their own; one table then serves both.
    const bool same = !seq || nn::same_rope_positions(*seq);
    Tensor q_positions, k_positions;
    {
      const profile::Scope tables("rope/positions", Device::cpu());  // host time only: the lookup
      q_positions = positions(q, false);
      k_positions = same ? q_positions : positions(k, true);
    }
    q = apply_rope(q, o.qkv_format, q_positions, {o.rope_base, o.rope_scaling}, o.rotary_dim);
    k = apply_rope(k, o.qkv_format, k_positions, {o.rope_base, o.rope_scaling}, o.rotary_dim);
  }
  // Under CP the module's rows are this rank's dual-chunk shard (the model's batches are cut so).
  const AttentionOutput attn =
      use_cp ? cp::context_parallel_attention(cp::dual_chunk_of(q, *cp), cp::dual_chunk_of(k, *cp),
                                              cp::dual_chunk_of(v, *cp), nn::with_cp_sink(spec_, cp->group->size()),
                                              seq, *cp)
             : dot_product_attention(q, k, v, spec_, seq, o.kernel_config);
  return o_proj_->forward(nn::merge_heads(attn.out));  // (.., C)
}

Tensor MultiHeadAttention::forward_cached(const Tensor& x, const KVCacheStep& step, KVCache& cache) const {
  const MultiHeadAttentionOptions& o = options_;
  check_cached_attention(spec_, x, step, kOp);
  nn::check_hidden(x, o.qkv_format, o.hidden_size, kOp);
  auto [q, k, v] = project_qkv(x, *q_proj_, *k_proj_, *v_proj_, o);  // (T_new, H, D), (T_new, H_kv, D) x 2
  if (o.rope) {
    const Tensor positions = step.position_tensor(x.device());
    q = nn::apply_rope(q, o.qkv_format, positions, {o.rope_base, o.rope_scaling}, o.rotary_dim);
    k = nn::apply_rope(k, o.qkv_format, positions, {o.rope_base, o.rope_scaling}, o.rotary_dim);
  }
  const Tensor attn = attend_appending(q, k, v, cache, spec_, step, o.kernel_config);  // (T_new, H, D)
  return o_proj_->forward(nn::merge_heads(attn));                                      // (T_new, C)
}

}  // namespace cpf::nn
