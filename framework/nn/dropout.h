#pragma once
// nn::Dropout: during training, zeroes each element with probability p and scales the kept ones by
// 1 / (1 - p), so the expected output is the input; in eval mode (Module::eval) it is the identity and
// returns the input tensor itself.
//
// The mask is drawn from `gen` (a Philox stream: the same seed gives the same masks on any device and
// thread count), or from the process's default generator when `gen` is null. The generator must outlive
// the module. The gradient flows through the kept elements, scaled the same way.
#include "framework/core/generator.h"
#include "framework/nn/module.h"

namespace cpf::nn {

class Dropout : public Module {
 public:
  // p in [0, 1): 0 keeps everything (the identity); 1 would drop everything and is refused.
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) const;
  double p() const { return p_; }

 private:
  double p_;
  Generator* gen_;
};

}  // namespace cpf::nn
