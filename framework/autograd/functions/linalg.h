#pragma once
#include "framework/tensor/tensor.h"

namespace cpf {

// a (..., M, K) @ b (..., K, N) with batch broadcasting; 1-D operands as in numpy.
Tensor matmul(const Tensor& a, const Tensor& b);

// x (..., K) @ weight^T + bias: weight (N, K), bias (N) or undefined -> (..., N). One 2-D GEMM per
// pass over the flattened leading dims: dX = dY W, dW = dY^T X (already (N, K): no transposed
// gradient to copy), dbias = the column sum of dY; on a device the forward bias is a GEMM epilogue.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace cpf
