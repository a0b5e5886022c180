#pragma once
#include "framework/autograd/functions/linear.h"  // linear, linear_gelu, gelu_mlp
#include "framework/tensor/tensor.h"

namespace cpf {

// a (..., M, K) @ b (..., K, N) with batch broadcasting; 1-D operands as in numpy.
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace cpf
