#pragma once
// LayerNorm over the last dim: y = (x - mean) / sqrt(var + eps) * weight + bias, weight starting at
// ones and bias at zeros (GPT-2's normalisation; `bias: false` drops the bias as in newer models).
#include "framework/autograd/functions/add_norm.h"
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
  // The residual add fused with this norm (framework/autograd/functions/add_norm.h): x1 = x + branch in x's
  // dtype and y = norm(x1) in out_dtype, one kernel on a device. An undefined branch normalises x alone
  // (x1 = x), still writing y in out_dtype (an f32 stream normalised straight into a bf16 sub-block).
  AddNormOutput forward_add(const Tensor& x, const Tensor& branch, DType out_dtype) const;  // (..., dim) each
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  const LayerNormOptions& options() const { return options_; }

 private:
  LayerNormOptions options_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace cpf::nn
