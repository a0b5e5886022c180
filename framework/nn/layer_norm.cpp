#include "framework/nn/layer_norm.h"

#include "framework/autograd/ops.h"
#include "framework/nn/norm_checks.h"
#include "framework/nn/precision.h"
#include "framework/tensor/profile.h"

namespace cpf::nn {

LayerNorm::LayerNorm(const LayerNormOptions& options) : options_(options) {
  check_norm_options("LayerNorm", options.dim, options.eps, options.dtype);
  weight_ = register_parameter("weight", ones({options.dim}, {.dtype = options.dtype}));
  if (options.bias) bias_ = register_parameter("bias", zeros({options.dim}, {.dtype = options.dtype}));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  const profile::Scope scope("forward/layer_norm", x.defined() ? x.device() : Device::cpu());
  check_norm_input("LayerNorm", x, options_.dim);
  // A bf16 input normalises with bf16 copies of the affine parameters; statistics stay in f32.
  const Tensor weight = compute_parameter(weight_, x.dtype(), "LayerNorm", "weight");
  return layer_norm(x, weight, compute_parameter(bias_, x.dtype(), "LayerNorm", "bias"), options_.eps);
}

AddNormOutput LayerNorm::forward_add(const Tensor& x, const Tensor& branch, DType out_dtype) const {
  const profile::Scope scope("forward/layer_norm", x.defined() ? x.device() : Device::cpu());
  check_norm_input("LayerNorm", x, options_.dim);
  // The parameters follow the stream x (f32 under mixed precision): only y is narrowed.
  const Tensor weight = compute_parameter(weight_, x.dtype(), "LayerNorm", "weight");
  const Tensor bias = compute_parameter(bias_, x.dtype(), "LayerNorm", "bias");
  return add_layer_norm(x, branch, weight, bias, options_.eps, out_dtype);
}

}  // namespace cpf::nn
