#pragma once
// The residual add fused with the following LayerNorm / RMSNorm (non-differentiable kernels;
// cpf::add_norm in framework/autograd/functions/add_norm.h wraps them). A pre-norm transformer adds each
// sub-block's output to the residual stream and normalises the sum for the next sub-block; fused, the
// stream is read once and the normalised rows are written directly in the compute dtype:
//
//   x1 = x + branch        (..., C) in x's dtype (the residual stream: f32 under mixed precision)
//   y  = norm(x1)          (..., C) in out_dtype (bf16 for a bf16 sub-block)
//
// The function is exactly `to(norm(x + to(branch, x.dtype())), out_dtype)` with raw::layer_norm /
// raw::rms_norm (norm.h): statistics in the compute dtype (f32 for f32/bf16, f64 for f64), the affine
// parameters in x's dtype. An undefined branch is the plain norm with its output in out_dtype (x1 = x).
//
// Dtypes: branch and out_dtype are x's dtype, or bf16 with an f32 x; weight and bias are (C) of x's
// dtype or undefined (bias: LayerNorm only).
#include <optional>

#include "framework/tensor/tensor.h"

namespace cpf::raw {

enum class NormKind { layer_norm, rms_norm };

struct AddNormResult {
  Tensor x1;    // (..., C) x's dtype; x itself when there is no branch
  Tensor y;     // (..., C) out_dtype
  Tensor mean;  // (...) compute dtype; undefined for rms_norm
  Tensor rstd;  // (...) compute dtype
};

AddNormResult add_norm(NormKind kind, const Tensor& x, const Tensor& branch, const Tensor& weight, const Tensor& bias,
                       double eps, DType out_dtype);

struct AddNormGrads {
  Tensor dx;       // (..., C) x1's dtype: grad_x1 + the norm's input gradient
  Tensor dbranch;  // (..., C) branch_dtype (dx converted); undefined without a branch
  Tensor dweight;  // (C); undefined when weight is undefined
  Tensor dbias;    // (C); layer_norm with a bias only
};

// From the gradients of both outputs: grad_x1 (x1's dtype, or undefined for none) and grad_y (y's dtype,
// or undefined for none). `branch_dtype`: the branch's dtype, or nullopt when add_norm had no branch.
// mean/rstd are add_norm's statistics (mean undefined for rms_norm).
AddNormGrads add_norm_backward(NormKind kind, const Tensor& grad_x1, const Tensor& grad_y, DType y_dtype,
                               const Tensor& x1, const Tensor& weight, bool has_bias, const Tensor& mean,
                               const Tensor& rstd, std::optional<DType> branch_dtype);

}  // namespace cpf::raw
