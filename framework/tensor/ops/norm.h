#pragma once
// LayerNorm and RMSNorm over the last dim, forward and backward (non-differentiable kernels;
// cpf::layer_norm / cpf::rms_norm in framework/autograd/functions/nn.h wrap them).
//
// x is (..., C) of any rank >= 1; weight and bias are (C) of x's dtype, or undefined for no affine
// transform. The per-row statistics (mean, rstd: x's shape without its last dim) are kept in the
// compute dtype (f32 for f32/bf16, f64 for f64) so the backward can reuse them. Parameter gradients
// are summed over rows in a fixed order: results do not depend on the thread count.
#include "framework/tensor/tensor.h"

namespace cpf::raw {

struct LayerNormResult {
  Tensor y;     // (..., C), x's dtype
  Tensor mean;  // (...)
  Tensor rstd;  // (...), 1 / sqrt(var + eps) with the biased variance
};

struct NormGrads {
  Tensor dx;       // (..., C)
  Tensor dweight;  // (C); undefined when weight is undefined
  Tensor dbias;    // (C); layer_norm only (always computed: the kernel does not know whether a bias exists)
};

// y = (x - mean) * rstd * weight + bias.
LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd);

struct RmsNormResult {
  Tensor y;     // (..., C), x's dtype
  Tensor rstd;  // (...), 1 / sqrt(mean(x^2) + eps)
};

// y = x * rstd * weight.
RmsNormResult rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
NormGrads rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd);

}  // namespace cpf::raw
