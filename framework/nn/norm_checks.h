#pragma once
// The checks LayerNorm and RMSNorm share: their options when built, and an input's last dim when
// called (forward and forward_add); `module` names the caller in the messages.
#include <cmath>

#include "framework/core/error.h"
#include "framework/tensor/tensor.h"

namespace cpf::nn {

inline void check_norm_options(const char* module, int64_t dim, double eps, DType dtype) {
  CPF_CHECK(dim > 0, module, ": dim=", dim, " must be positive");
  CPF_CHECK(std::isfinite(eps) && eps > 0, module, ": eps=", eps, " must be positive");
  CPF_CHECK(is_floating(dtype), module, ": dtype must be floating, got ", dtype);
}

inline void check_norm_input(const char* module, const Tensor& x, int64_t dim) {  // x: (..., dim)
  CPF_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == dim, module, ": input of shape ",
            x.defined() ? x.shape() : Shape{}, " does not end in dim=", dim);
}

}  // namespace cpf::nn
