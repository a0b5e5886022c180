#include "framework/nn/linear.h"

#include <cmath>

#include "framework/autograd/fp8_autocast.h"
#include "framework/autograd/ops.h"
#include "framework/nn/compute_copies.h"
#include "framework/nn/precision.h"
#include "framework/tensor/profile.h"

namespace cpf::nn {

Linear::Linear(const LinearOptions& options, Generator* gen) : options_(options) {
  CPF_CHECK(options.in_features > 0 && options.out_features > 0, "Linear: in_features=", options.in_features,
            " and out_features=", options.out_features, " must be positive");
  CPF_CHECK(is_floating(options.dtype), "Linear: dtype must be floating, got ", options.dtype);
  const Shape shape{options.out_features, options.in_features};
  const TensorOptions topts{.dtype = options.dtype};
  Tensor w;
  if (options.init_std > 0) {
    w = normal(shape, 0.0, options.init_std, topts, gen);
  } else {
    const double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features));
    w = uniform(shape, -bound, bound, topts, gen);
  }
  weight_ = register_parameter("weight", w);
  if (options.bias) bias_ = register_parameter("bias", zeros({options.out_features}, topts));
}

Tensor Linear::forward(const Tensor& x) const {
  const profile::Scope scope("forward/linear", x.defined() ? x.device() : Device::cpu());
  CPF_CHECK(x.dim() >= 1 && x.size(-1) == options_.in_features, "Linear: input of shape ", x.shape(),
            " does not end in in_features=", options_.in_features);
  return linear(x, weights_for(x));  // (..., out)
}

LinearWeights Linear::weights_for(const Tensor& x) const {
  // Computes in x's dtype: the op casts f32 master weights for a bf16 input and hands them f32
  // gradients straight from its dW GEMM (framework/autograd/functions/linear.h).
  CPF_CHECK(weight_.dtype() == x.dtype() || (weight_.dtype() == DType::f32 && x.dtype() == DType::bf16),
            "Linear: input dtype ", x.dtype(), " does not match the weight dtype ", weight_.dtype(),
            " (mixed precision narrows f32 parameters to bf16 inputs only; convert the input to ", weight_.dtype(),
            ")");
  // An FP8 GEMM (fp8_autocast.h) casts the f32 master itself: looking up the bf16 copy would mark it wanted,
  // and every refresh would then convert a weight no GEMM reads (1.07B parameters: 6.4 GB of traffic a step).
  if (use_fp8_linear(x, options_.out_features)) return {weight_, bias_, Tensor(), Tensor()};
  // The step's bf16 copy when the model keeps one (compute_copies.h); undefined: the op casts.
  return {weight_, bias_, active_compute_copy(weight_, x.dtype()),
          bias_.defined() ? active_compute_copy(bias_, x.dtype()) : Tensor()};
}

}  // namespace cpf::nn
