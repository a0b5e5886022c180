// cuBLASLt calls of the unfused attention path (unfused_gemm.cuh), through the backend's one cuBLASLt
// layer (framework/tensor/cuda/cublaslt.cuh: handles, layouts, algorithm cache).
//
// A row-major (r x c) matrix with row stride ld is the column-major (c x r) matrix with leading
// dimension ld, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLASLt's first operand is
// our B, its second our A, its (m, n) our (n, m). A row-major operand stored as op(X) is column-major
// op(X)^T (no transpose flag); one stored transposed is column-major op(X) and takes CUBLAS_OP_T.
#include "attention/cuda/unfused_gemm.cuh"

#include <cstdint>

#include "framework/core/error.h"
#include "framework/tensor/cuda/cublaslt.cuh"

namespace cpf::attention_cuda::unfused {

static_assert(kGemmWorkspaceBytes == cuda::lt::kWorkspaceBytes, "the attention workspace feeds cuBLASLt calls");

void gemm(int device, DType dtype, bool tf32, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
          const GemmOperand& a, const GemmOperand& b, double beta, const GemmOutput& c, void* workspace,
          cudaStream_t stream) {
  CPF_CHECK(dtype == DType::f32 || dtype == DType::f64, "attention (unfused): gemm computes in f32 or f64, got ",
            dtype);
  CPF_CHECK(batch > 0 && m > 0 && n > 0 && k > 0 && batch <= INT32_MAX,
            "attention (unfused): gemm sizes must be "
            "positive: batch=",
            batch, " m=", m, " n=", n, " k=", k);
  CPF_CHECK(beta == 0.0 || beta == 1.0, "attention (unfused): gemm beta must be 0 (overwrite) or 1 (accumulate), got ",
            beta);
  const cudaDataType_t type = dtype == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  const auto es = static_cast<uint64_t>(dtype_size(dtype));
  cuda::lt::LtGemm g;
  g.device = device;
  g.ab_type = g.cd_type = g.scale_type = type;
  g.compute = dtype == DType::f64 ? CUBLAS_COMPUTE_64F : tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  g.opa = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.opb = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.m = static_cast<uint64_t>(n);
  g.n = static_cast<uint64_t>(m);
  g.k = static_cast<uint64_t>(k);
  g.batch = batch;
  g.lda = b.ld;
  g.ldb = a.ld;
  g.ldc = c.ld;
  g.stride_a = batch > 1 ? b.batch_stride : 0;
  g.stride_b = batch > 1 ? a.batch_stride : 0;
  g.stride_c = batch > 1 ? c.batch_stride : 0;
  auto align = [&](const void* p, int64_t ld, int64_t stride) {
    return cuda::lt::alignment_of(
        {reinterpret_cast<uint64_t>(p), static_cast<uint64_t>(ld) * es, static_cast<uint64_t>(stride) * es});
  };
  g.align_a = align(b.data, b.ld, g.stride_a);
  g.align_b = align(a.data, a.ld, g.stride_b);
  g.align_c = align(c.data, c.ld, g.stride_c);
  g.accumulate = beta == 1.0;
  cuda::lt::LtPointers p;
  p.a = b.data;
  p.b = a.data;
  p.d = c.data;
  cuda::lt::run(g, p, workspace, stream, alpha);
}

}  // namespace cpf::attention_cuda::unfused
