#pragma once
// RMSNorm over the last dim: y = x / sqrt(mean(x^2) + eps) * weight, weight starting at ones
// (Llama's normalisation: no mean subtraction, no bias).
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
  const Tensor& weight() const { return weight_; }
  const RMSNormOptions& options() const { return options_; }

 private:
  RMSNormOptions options_;
  Tensor weight_;
};

}  // namespace cpf::nn
