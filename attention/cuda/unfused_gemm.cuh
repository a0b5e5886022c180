#pragma once
// Strided-batched GEMMs of the unfused attention path, in row-major terms (private to
// cpf_attention_cuda: includes CUDA headers).
//
//   C[b] (m x n, row stride ldc) = alpha * op(A[b]) (m x k) * op(B[b]) (k x n) + beta * C[b]
//
// for b < batch, where X[b] starts batch_stride elements after X[b-1]. An operand is stored
// row-major with row stride `ld`: as op(X) itself, or transposed (the stored matrix is op(X)^T, a
// transposed view read in place). The attention kernels address heads of a (token, head, dim)
// tensor this way: rows are tokens (ld = the token stride), the batch walks heads (stride = a
// multiple of the head dim), so no operand is ever copied.
//
// Types: f32 computes in f32, or on TF32 tensor cores when `tf32` (f32 accumulation; inputs rounded
// to 10 mantissa bits, which leaves bf16-valued inputs exact), f64 in f64. cuBLASLt is deterministic
// for a fixed problem on a fixed GPU (its split-K reductions are ordered), so repeated calls give
// bitwise equal results.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "framework/tensor/dtype.h"

namespace cpf::attention_cuda::unfused {

struct GemmOperand {
  const void* data = nullptr;
  int64_t ld = 0;            // elements between consecutive stored rows
  int64_t batch_stride = 0;  // elements between consecutive batch entries (0: shared by all)
  bool transposed = false;   // stored as op(X)^T
};

struct GemmOutput {
  void* data = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

// The cuBLASLt workspace each call may use (the caller provides one per stream).
inline constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

// dtype f32 or f64; m, n, k, batch > 0; beta 0 or 1. Runs on `stream` of `device` (the caller's
// current device) through the backend's cuBLASLt layer (framework/tensor/cuda/cublaslt.cuh).
void gemm(int device, DType dtype, bool tf32, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
          const GemmOperand& a, const GemmOperand& b, double beta, const GemmOutput& c, void* workspace,
          cudaStream_t stream);

}  // namespace cpf::attention_cuda::unfused
