#include "framework/nn/mlp.h"

#include <cmath>

#include "framework/autograd/fp8_autocast.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/autograd/functions/linear_cat.h"
#include "framework/autograd/ops.h"
#include "framework/nn/compute_copies.h"
#include "framework/tensor/profile.h"

namespace cpf::nn {

const char* activation_name(Activation activation) { return activation == Activation::gelu ? "gelu" : "swiglu"; }

MLP::MLP(const MLPOptions& options, Generator* gen) : options_(options) {
  const MLPOptions& o = options_;
  CPF_CHECK(o.hidden_size > 0 && o.intermediate_size > 0, "MLP: hidden_size=", o.hidden_size,
            " and intermediate_size=", o.intermediate_size, " must be positive");
  CPF_CHECK(std::isfinite(o.init_std) && o.init_std >= 0 && std::isfinite(o.out_init_std) && o.out_init_std >= 0,
            "MLP: init_std=", o.init_std, " and out_init_std=", o.out_init_std, " must be finite and >= 0");
  auto linear = [&](int64_t in, int64_t out, double std) {
    return std::make_shared<Linear>(
        LinearOptions{.in_features = in, .out_features = out, .bias = o.bias, .init_std = std, .dtype = o.dtype}, gen);
  };
  const double out_std = o.out_init_std > 0 ? o.out_init_std : o.init_std;
  if (o.activation == Activation::gelu) {
    in_ = register_module("fc_in", linear(o.hidden_size, o.intermediate_size, o.init_std));
    out_ = register_module("fc_out", linear(o.intermediate_size, o.hidden_size, out_std));
  } else {
    gate_ = register_module("gate_proj", linear(o.hidden_size, o.intermediate_size, o.init_std));
    in_ = register_module("up_proj", linear(o.hidden_size, o.intermediate_size, o.init_std));
    out_ = register_module("down_proj", linear(o.intermediate_size, o.hidden_size, out_std));
  }
}

Tensor MLP::forward(const Tensor& x) const {
  CPF_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == options_.hidden_size, "MLP: input of shape ",
            x.defined() ? x.shape() : Shape{}, " does not end in hidden_size=", options_.hidden_size);
  if (options_.activation == Activation::gelu) {
    // One op: GELU in the fc_in GEMM's epilogue, its derivative in the backward dH GEMM's (linear.h).
    const profile::Scope scope("forward/gelu_mlp", x.device());
    return gelu_mlp(x, in_->weights_for(x), out_->weights_for(x));  // (..., C)
  }
  Tensor gate_up, h;
  {
    // gate_proj and up_proj as one GEMM over their concatenated compute copies (linear_cat.h).
    const profile::Scope scope("forward/linear", x.device());
    const std::vector<LinearWeights> parts = {gate_->weights_for(x), in_->weights_for(x)};
    // (..., 2 I) = [gate | up]; a decoding step's few rows use the kept concatenation (compute_copies.h)
    gate_up = linear_cat(x, parts, kLinearCatMinFusedRows, active_stacked_copies(x, parts));
  }
  if (fp8_fuse_activation_casts() && use_fp8_linear(gate_up, options_.intermediate_size, options_.hidden_size)) {
    // FP8 autocast: SwiGLU's output reaches down_proj only as FP8 codes, written by one pass over gate_up
    // (fp8_linear_after); h never exists in bf16.
    const profile::Scope scope("forward/swiglu_fp8_linear", x.device());
    const LinearWeights down = out_->weights_for(x);
    return fp8_linear_after(raw::CastActivation::swiglu, gate_up, down.weight, down.bias, *next_fp8_linear_options());
  }
  {
    // One kernel for silu(gate) * up, one for both halves of its gradient (framework/tensor/ops/swiglu.h).
    const profile::Scope scope("forward/swiglu", x.device());
    h = swiglu_packed(gate_up);  // (..., I)
  }
  return out_->forward(h);  // (..., C)
}

}  // namespace cpf::nn
