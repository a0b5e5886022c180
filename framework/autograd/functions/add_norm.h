#pragma once
// The residual add fused with the following norm, differentiable (raw kernels and exact semantics:
// framework/tensor/ops/add_norm.h). A pre-norm block's
//
//   x1 = add(x, to(branch, x.dtype()));  y = to(layer_norm(x1, weight, bias), out_dtype)
//
// becomes one op with one kernel each way on a device. Gradients: x and branch get grad_x1 plus the
// norm's input gradient (branch in its own dtype), weight and bias the norm's parameter gradients.
// Without a branch (undefined) it is the norm alone with its output in out_dtype, and x1 is x itself.
#include "framework/tensor/tensor.h"

namespace cpf {

struct AddNormOutput {
  Tensor x1;  // (..., C) x's dtype: the new residual stream
  Tensor y;   // (..., C) out_dtype: its normalised rows
};

AddNormOutput add_layer_norm(const Tensor& x, const Tensor& branch, const Tensor& weight, const Tensor& bias,
                             double eps, DType out_dtype);
AddNormOutput add_rms_norm(const Tensor& x, const Tensor& branch, const Tensor& weight, double eps, DType out_dtype);

}  // namespace cpf
