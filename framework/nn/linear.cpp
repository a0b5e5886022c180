#include "framework/nn/linear.h"

#include <cmath>

#include "framework/autograd/ops.h"
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
  // Computes in x's dtype: f32 master weights are cast for a bf16 input (framework/nn/precision.h).
  const Tensor w = compute_parameter(weight_, x.dtype(), "Linear", "weight");  // (out, in)
  const Tensor b = compute_parameter(bias_, x.dtype(), "Linear", "bias");      // (out) or undefined
  return linear(x, w, b);                                                       // (..., out)
}

}  // namespace cpf::nn
