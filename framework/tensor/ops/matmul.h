#pragma once
// Matrix products on Eigen. Operands may be transposed views (either of the last two strides equal
// to 1): they are mapped as row- or column-major matrices without a copy.
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// a (..., M, K) @ b (..., K, N) -> (..., M, N); leading (batch) dims broadcast. 1-D operands are
// treated as a row (a) or a column (b) vector and that dim is dropped from the result, as numpy does.
Tensor matmul(const Tensor& a, const Tensor& b);

// Reports one GEMM out (..., M, N) = a (..., M, K) @ b (..., K, N) to the profiler (profile::add_work:
// 2 M N K per batch entry, the operands' and the result's bytes, plus `extra_bytes` an epilogue moves).
// Every GEMM entry of the raw layer calls it, the fused epilogues included.
void report_gemm_work(const Tensor& out, const Tensor& a, const Tensor& b, double extra_bytes = 0);

}  // namespace cpf::raw
