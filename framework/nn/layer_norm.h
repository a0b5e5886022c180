#pragma once
// LayerNorm over the last dim: y = (x - mean) / sqrt(var + eps) * weight + bias, weight starting at
// ones and bias at zeros (GPT-2's normalisation; `bias: false` drops the bias as in newer models).
#include "framework/nn/module.h"

namespace cpf::nn {

struct LayerNormOptions {
  int64_t dim = 0;
  double eps = 1e-5;
  bool bias = true;
  DType dtype = DType::f32;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(const LayerNormOptions& options);
  Tensor forward(const Tensor& x) const;  // (..., dim) -> (..., dim)
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  const LayerNormOptions& options() const { return options_; }

 private:
  LayerNormOptions options_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace cpf::nn
