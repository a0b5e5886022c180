#include "framework/nn/rms_norm.h"

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/nn/precision.h"
#include "framework/tensor/profile.h"

namespace cpf::nn {

RMSNorm::RMSNorm(const RMSNormOptions& options) : options_(options) {
  CPF_CHECK(options.dim > 0, "RMSNorm: dim=", options.dim, " must be positive");
  CPF_CHECK(std::isfinite(options.eps) && options.eps > 0, "RMSNorm: eps=", options.eps, " must be positive");
  CPF_CHECK(is_floating(options.dtype), "RMSNorm: dtype must be floating, got ", options.dtype);
  weight_ = register_parameter("weight", ones({options.dim}, {.dtype = options.dtype}));
}

Tensor RMSNorm::forward(const Tensor& x) const {
  const profile::Scope scope("forward/rms_norm", x.defined() ? x.device() : Device::cpu());
  CPF_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == options_.dim, "RMSNorm: input of shape ",
            x.defined() ? x.shape() : Shape{}, " does not end in dim=", options_.dim);
  // A bf16 input normalises with a bf16 copy of the gain; the kernel keeps its statistics in f32.
  return rms_norm(x, compute_parameter(weight_, x.dtype(), "RMSNorm", "weight"), options_.eps);
}

AddNormOutput RMSNorm::forward_add(const Tensor& x, const Tensor& branch, DType out_dtype) const {
  const profile::Scope scope("forward/rms_norm", x.defined() ? x.device() : Device::cpu());
  CPF_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == options_.dim, "RMSNorm: input of shape ",
            x.defined() ? x.shape() : Shape{}, " does not end in dim=", options_.dim);
  // The gain follows the stream x (f32 under mixed precision): only y is narrowed.
  return add_rms_norm(x, branch, compute_parameter(weight_, x.dtype(), "RMSNorm", "weight"), options_.eps, out_dtype);
}

}  // namespace cpf::nn
