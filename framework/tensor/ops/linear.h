#pragma once
// The affine map of a linear layer as one op: y = x @ weight^T + bias. On a device the bias rides in
// the GEMM's epilogue (cuBLASLt), so the (tokens, out) result is written once instead of being
// re-read and re-written by a broadcast add; the CPU computes the same function as matmul + add.
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// x (..., K), weight (N, K), bias (N) or undefined -> (..., N). The leading dims of x are flattened
// into one 2-D GEMM; weight is read through its transposed view (no copy).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

}  // namespace cpf::raw
