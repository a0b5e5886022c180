#include "models/model_flops.h"

#include "framework/core/error.h"

namespace cpf::models {

double training_flops_per_token(const GPTOptions& o, int64_t num_parameters, int64_t seq_len) {
  CPF_CHECK(num_parameters >= 0 && seq_len >= 1 && o.num_layers >= 0 && o.num_heads >= 1,
            "training_flops_per_token: needs num_parameters >= 0, seq_len >= 1 and num_heads >= 1, got ",
            num_parameters, ", ", seq_len, " and ", o.num_heads);
  int64_t d_qk = 0, d_v = 0;
  if (o.attention == AttentionType::mla) {
    d_qk = o.qk_nope_head_dim + o.qk_rope_head_dim;
    d_v = o.v_head_dim;
  } else {
    d_qk = d_v = o.head_dim > 0 ? o.head_dim : o.hidden_size / o.num_heads;
  }
  const double dense = 6.0 * static_cast<double>(num_parameters);
  const double attention = 6.0 * static_cast<double>(o.num_layers) * static_cast<double>(o.num_heads) *
                           static_cast<double>(seq_len) * static_cast<double>(d_qk + d_v);
  return dense + attention;
}

}  // namespace cpf::models
