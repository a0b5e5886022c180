#include "framework/nn/rms_norm.h"

#include "framework/autograd/ops.h"
#include "framework/nn/norm_checks.h"
#include "framework/nn/precision.h"
#include "framework/tensor/profile.h"

namespace cpf::nn {

RMSNorm::RMSNorm(const RMSNormOptions& options) : options_(options) {
  check_norm_options("RMSNorm", options.dim, options.eps, options.dtype);
  weight_ = register_parameter("weight", ones({options.dim}, {.dtype = options.dtype}));
}

Tensor RMSNorm::forward(const Tensor& x) const {
  const profile::Scope scope("forward/rms_norm", x.defined() ? x.device() : Device::cpu());
  check_norm_input("RMSNorm", x, options_.dim);
  // A bf16 input normalises with a bf16 copy of the gain; the kernel keeps its statistics in f32.
  return rms_norm(x, compute_parameter(weight_, x.dtype(), "RMSNorm", "weight"), options_.eps);
}

AddNormOutput RMSNorm::forward_add(const Tensor& x, const Tensor& branch, DType out_dtype) const {
  const profile::Scope scope("forward/rms_norm", x.defined() ? x.device() : Device::cpu());
  check_norm_input("RMSNorm", x, options_.dim);
  // The gain follows the stream x (f32 under mixed precision): only y is narrowed.
  return add_rms_norm(x, branch, compute_parameter(weight_, x.dtype(), "RMSNorm", "weight"), options_.eps, out_dtype);
}

}  // namespace cpf::nn
