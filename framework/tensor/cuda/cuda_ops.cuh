#pragma once
// Internal entry points of the CUDA backend shared between its .cpp files (private).
#include "framework/tensor/device_ops.h"

namespace cpf::cuda {

// The cuda kernel table, installed by register_backend().
const DeviceOps& cuda_device_ops();

// The DeviceOps::matmul entry (matmul.cpp, cuBLASLt).
void matmul(const Tensor& out, const Tensor& a, const Tensor& b);
// The DeviceOps::matmul_bias entry: the bias in the GEMM's epilogue.
void matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias);
// The DeviceOps::matmul_epilogue entry (matmul_epilogue.cpp).
bool matmul_epilogue(const Tensor& out, const Tensor& a, const Tensor& b, const DeviceGemmArgs& args);

}  // namespace cpf::cuda
