#pragma once
// y = x W^T + b over the last dim: x (..., in_features) -> (..., out_features).
#include "framework/autograd/functions/linear.h"
#include "framework/core/generator.h"
#include "framework/nn/module.h"

namespace cpf::nn {

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  // Weight init: normal(0, init_std) when init_std > 0 (GPT-2 style), otherwise
  // uniform(±1/sqrt(in_features)). Bias starts at zero.
  double init_std = 0.0;
  DType dtype = DType::f32;
};

class Linear : public Module {
 public:
  explicit Linear(const LinearOptions& options, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) const;
  // The parameters as the linear ops take them for input x (dtype pair validated; compute_weight: a
  // copy in x's dtype when one is at hand, else undefined and the op casts).
  LinearWeights weights_for(const Tensor& x) const;
  const Tensor& weight() const { return weight_; }  // (out, in)
  const Tensor& bias() const { return bias_; }      // (out) or undefined
  const LinearOptions& options() const { return options_; }

 private:
  LinearOptions options_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace cpf::nn
