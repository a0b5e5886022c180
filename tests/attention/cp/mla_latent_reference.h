#pragma once
// The MLA latent expansion with autograd ops, independent of LatentKv (latent_kv.h): what the CP latent
// tests (CPU and GPU) compare the latent-communicating strategies against.
#include <utility>
#include <vector>

#include "attention/cp/latent_kv.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/join.h"

namespace cpf::cp::testing {

// latent (.., 1, r + rope) -> k (.., H, nope + rope), v (.., H, dv); `bias` may be undefined.
inline std::pair<Tensor, Tensor> expand_reference(const Tensor& latent, const Tensor& weight, const Tensor& bias,
                                                  const MlaLatentShape& s) {
  const std::vector<Tensor> parts = split(latent, std::vector<int64_t>{s.kv_lora_rank, s.qk_rope_head_dim}, -1);
  Tensor kv = matmul(parts[0], transpose(weight, 0, 1));  // (.., 1, H (nope + dv))
  if (bias.defined()) kv = kv + bias;
  Shape heads = kv.shape();
  heads.back() = s.qk_nope_head_dim + s.v_head_dim;
  heads[heads.size() - 2] = s.num_heads;
  kv = reshape(kv, heads);
  const std::vector<Tensor> kv_parts = split(kv, std::vector<int64_t>{s.qk_nope_head_dim, s.v_head_dim}, -1);
  Shape pe_shape = parts[1].shape();
  pe_shape[pe_shape.size() - 2] = s.num_heads;
  return {cat({kv_parts[0], expand(parts[1], pe_shape)}, -1), kv_parts[1]};
}

}  // namespace cpf::cp::testing
