#pragma once
// RMSNorm over the last dim: y = x / sqrt(mean(x^2) + eps) * weight, weight starting at ones
// (Llama's normalisation: no mean subtraction, no bias).
#include "framework/autograd/functions/add_norm.h"
#include "framework/nn/module.h"

namespace cpf::nn {

struct RMSNormOptions {
  int64_t dim = 0;
  double eps = 1e-6;
  DType dtype = DType::f32;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(const RMSNormOptions& options);
  Tensor forward(const Tensor& x) const;  // (..., dim) -> (..., dim)
  // The residual add fused with this norm (framework/autograd/functions/add_norm.h): x1 = x + branch in x's
  // dtype and y = norm(x1) in out_dtype, one kernel on a device. An undefined branch normalises x alone
  // (x1 = x), still writing y in out_dtype (an f32 stream normalised straight into a bf16 sub-block).
  AddNormOutput forward_add(const Tensor& x, const Tensor& branch, DType out_dtype) const;  // (..., dim) each
  const Tensor& weight() const { return weight_; }
  const RMSNormOptions& options() const { return options_; }

 private:
  RMSNormOptions options_;
  Tensor weight_;
};

}  // namespace cpf::nn
