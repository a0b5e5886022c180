#include "framework/nn/dropout.h"

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/random.h"

namespace cpf::nn {

Dropout::Dropout(double p, Generator* gen) : p_(p), gen_(gen) {
  CPF_CHECK(std::isfinite(p) && p >= 0 && p < 1, "Dropout: p=", p,
            " must be in [0, 1) (the probability of zeroing an element; 0 = keep all)");
}

Tensor Dropout::forward(const Tensor& x) const {
  CPF_CHECK(x.defined(), "Dropout: the input is undefined");
  if (!is_training() || p_ == 0) return x;
  CPF_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64 || x.dtype() == DType::bf16,
            "Dropout: needs a floating-point input, got ", dtype_name(x.dtype()));
  // keep = u >= p for u uniform in [0, 1): probability 1 - p. The scaled mask is a constant of the graph.
  const Tensor u = rand(x.shape(), {.dtype = DType::f32, .device = x.device()}, gen_);
  const Tensor keep = raw::to(raw::compare(raw::CompareOp::ge, u, p_), x.dtype());
  return mul(x, raw::binary(raw::BinaryOp::mul, keep, 1.0 / (1.0 - p_)));
}

}  // namespace cpf::nn
