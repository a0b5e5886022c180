#include "framework/nn/layer_norm.h"

#include <cmath>

#include "framework/autograd/ops.h"

namespace cpf::nn {

LayerNorm::LayerNorm(const LayerNormOptions& options) : options_(options) {
  CPF_CHECK(options.dim > 0, "LayerNorm: dim=", options.dim, " must be positive");
  CPF_CHECK(std::isfinite(options.eps) && options.eps > 0, "LayerNorm: eps=", options.eps, " must be positive");
  CPF_CHECK(is_floating(options.dtype), "LayerNorm: dtype must be floating, got ", options.dtype);
  weight_ = register_parameter("weight", ones({options.dim}, {.dtype = options.dtype}));
  if (options.bias) bias_ = register_parameter("bias", zeros({options.dim}, {.dtype = options.dtype}));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  CPF_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == options_.dim, "LayerNorm: input of shape ",
            x.defined() ? x.shape() : Shape{}, " does not end in dim=", options_.dim);
  return layer_norm(x, weight_, bias_, options_.eps);
}

}  // namespace cpf::nn
