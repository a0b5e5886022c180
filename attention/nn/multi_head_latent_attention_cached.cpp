// MultiHeadLatentAttention::forward_cached: incremental decoding that caches the latent, not per-head
// keys and values (DeepSeek-V2's absorbed form).
//
// With W_UK_h / W_UV_h the key / value rows of kv_b_proj for head h (and b_k_h / b_v_h its bias):
//   score_h(t, j) = q_nope_h(t) . (W_UK_h c_j + b_k_h) + q_pe_h(t) . k_pe_j
//                 = [W_UK_h^T q_nope_h(t) | q_pe_h(t) | q_nope_h(t) . b_k_h] . [c_j | k_pe_j | 1]
//   out_h(t)      = sum_j p_hj (W_UV_h c_j + b_v_h) = W_UV_h (sum_j p_hj c_j) + b_v_h (sum_j p_hj)
// so attention runs with one key/value head shared by all query heads: keys [c | k_pe (| 1)], values
// [c (| 1)], the softmax scale of the per-head form. Each cached token costs kv_lora_rank + rope (+1
// with biases) numbers per layer instead of num_heads * (nope + rope + v_head_dim); the trailing 1
// columns carry the biases exactly, also with attention sinks (where sum_j p_hj < 1).
#include "attention/nn/attention_layout.h"
#include "attention/nn/multi_head_latent_attention.h"
#include "framework/autograd/ops.h"
#include "framework/nn/precision.h"

namespace cpf::nn {

Tensor MultiHeadLatentAttention::forward_cached(const Tensor& x, const KVCacheStep& step, KVCache& cache) const {
  constexpr const char* kOp = "MultiHeadLatentAttention";
  const MultiHeadLatentAttentionOptions& o = options_;
  check_cached_attention(spec_, x, step, kOp);
  nn::check_hidden(x, o.qkv_format, o.hidden_size, kOp);
  const int64_t t_new = x.size(0), heads = o.num_heads, nope = o.qk_nope_head_dim, rank = o.kv_lora_rank;
  const Tensor positions = step.position_tensor(x.device());

  const Tensor q = rotated_q(x, positions);  // (T, H, nope + rope)
  const std::vector<Tensor> q_parts = split(q, std::vector<int64_t>{nope, o.qk_rope_head_dim}, -1);
  const auto [c_kv, k_pe] = latent_parts(x, positions);  // (T, rank), (T, 1, rope)
  const DType dtype = c_kv.dtype();
  // kv_b_proj's weight (H * (nope + v), rank) as W_UK (H, nope, rank) and W_UV (H, v, rank).
  const Tensor w = reshape(compute_parameter(kv_b_proj_->weight(), dtype, kOp, "kv_b_proj weight"),
                           {heads, nope + o.v_head_dim, rank});
  const std::vector<Tensor> w_parts = split(w, std::vector<int64_t>{nope, o.v_head_dim}, 1);

  std::vector<Tensor> q_cols, k_cols{unsqueeze(c_kv, -2), k_pe}, v_cols{unsqueeze(c_kv, -2)};
  // W_UK_h^T q_nope_h: (H, T, nope) @ (H, nope, rank) -> (T, H, rank); no nope dims: zeros.
  q_cols.push_back(nope > 0 ? permute(matmul(permute(q_parts[0], {1, 0, 2}), w_parts[0]), {1, 0, 2})
                            : zeros({t_new, heads, rank}, {.dtype = dtype, .device = x.device()}));
  q_cols.push_back(q_parts[1]);
  Tensor b_v;  // (H, v) or undefined
  if (kv_b_proj_->bias().defined()) {
    const Tensor b =
        reshape(compute_parameter(kv_b_proj_->bias(), dtype, kOp, "kv_b_proj bias"), {heads, nope + o.v_head_dim});
    const std::vector<Tensor> b_parts = split(b, std::vector<int64_t>{nope, o.v_head_dim}, 1);
    q_cols.push_back(sum(mul(q_parts[0], b_parts[0]), {-1}, /*keepdim=*/true));  // (T, H, 1): q_nope . b_k
    const Tensor one = ones({t_new, 1, 1}, {.dtype = dtype, .device = x.device()});
    k_cols.push_back(one);
    v_cols.push_back(one);
    b_v = b_parts[1];
  }
  const Tensor k_new = cat(k_cols, -1), v_new = cat(v_cols, -1);  // (T, 1, rank + rope (+1)), (T, 1, rank (+1))

  AttentionSpec latent_spec = spec_;
  latent_spec.num_kv_heads = 1;
  latent_spec.head_dim_qk = k_new.size(-1);
  latent_spec.head_dim_v = v_new.size(-1);
  latent_spec.softmax_scale = softmax_scale(spec_, nope + o.qk_rope_head_dim);  // the per-head form's
  const Tensor attn =
      attend_appending(cat(q_cols, -1), k_new, v_new, cache, latent_spec, step, o.kernel_config);  // (T, H, rank (+1))
  const std::vector<Tensor> out_parts =
      split(attn, b_v.defined() ? std::vector<int64_t>{rank, 1} : std::vector<int64_t>{rank}, -1);
  // W_UV_h (sum_j p c_j): (H, T, rank) @ (H, rank, v) -> (T, H, v)
  Tensor out = permute(matmul(permute(out_parts[0], {1, 0, 2}), transpose(w_parts[1], 1, 2)), {1, 0, 2});
  if (b_v.defined()) out = add(out, mul(out_parts[1], b_v));  // + b_v (sum_j p)
  return o_proj_->forward(nn::merge_heads(out));              // (T, C)
}

}  // namespace cpf::nn
