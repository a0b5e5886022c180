#pragma once
// How a row-major matmul of tensors runs on cuBLASLt (private: includes CUDA headers). matmul.cpp
// (DeviceOps::matmul, matmul_bias) and matmul_epilogue.cpp (DeviceOps::matmul_epilogue) share it.
//
// out (..., M, N) = a (..., M, K) @ b (..., K, N) is computed as out^T = b^T a^T: cuBLASLt's A is our
// b, its B is our a, its (m, n) our (N, M). Batch dims are merged where their strides allow; the
// innermost merged batch dim becomes cuBLASLt's strided batch (stride 0 for a broadcast operand) and
// any others are looped over by run_gemm.
#include <array>

#include "framework/tensor/cuda/cublaslt.cuh"
#include "framework/tensor/tensor.h"

namespace cpf::cuda {

struct GemmPlan {
  lt::LtGemm gemm{};             // the innermost (strided) batch's problem; epilogue none
  Shape sizes;                   // batch dims after merging; the last is cuBLASLt's strided batch
  std::array<Shape, 3> strides;  // element strides of out, a, b along each
};

// a and b share one floating dtype; out has it too, or is f32 for bf16 a, b (f32 accumulation
// written without a rounding step, for gradients kept in f32).
GemmPlan plan_gemm(const Tensor& out, const Tensor& a, const Tensor& b);

// One cuBLASLt call per index of the outer (non-merged) batch dims, on the current stream. `extra`
// carries the epilogue's pointers (its a, b, d are filled in here).
void run_gemm(const GemmPlan& plan, const Tensor& out, const Tensor& a, const Tensor& b, const lt::LtPointers& extra);

}  // namespace cpf::cuda
