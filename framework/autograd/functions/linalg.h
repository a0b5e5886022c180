#pragma once
#include "framework/tensor/tensor.h"

namespace cpf {

// a (..., M, K) @ b (..., K, N) with batch broadcasting; 1-D operands as in numpy.
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace cpf
