#pragma once
// The one cuBLASLt layer of the CUDA code (private: includes CUDA headers). matmul.cpp,
// matmul_epilogue.cpp and the unfused attention path (attention/cuda/unfused_gemm.cpp) describe their
// problem in cuBLASLt's column-major terms (a LtGemm) and run it here, so the handle per device, the
// status check, the layouts, the algorithm cache and the workspace size exist once.
//
// Row-major tensors map onto cuBLASLt without copies: a row-major (r, c) matrix with row stride ld is
// the column-major (c, r) matrix with leading dimension ld, so C = A B is computed as C^T = B^T A^T
// (cuBLASLt's first operand is our B). `describe` gives that view of one row-major operand.
//
// Epilogues (cuBLASLt names; "rows" are the column-major rows of D, i.e. our row-major columns):
//   bias       D = A B + bias                      bias: one value per D row (BIAS)
//   gelu_aux   D = gelu(A B [+ bias]), aux = A B [+ bias]   (GELU_AUX[_BIAS]; tanh-approximated GELU)
//   dgelu      D = (A B) * gelu'(aux) [, bias_grad = row sums of D]      (DGELU[_BGRAD])
//   bgradb     D = A B, bias_grad = the sums of op(B) over k, one per D column (BGRADB)
// The bias / bias gradient has D's data type; aux has D's type and leading dimension aux_ld (a
// multiple of 8, cuBLASLt's rule).
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "framework/core/error.h"

#define CPF_CUBLAS_CHECK(call)                                                                      \
  do {                                                                                              \
    const cublasStatus_t cpf_status_ = (call);                                                      \
    CPF_CHECK(cpf_status_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error in ", #call, ": ",                \
              cublasLtGetStatusString(cpf_status_), " (", cublasLtGetStatusName(cpf_status_), ")"); \
  } while (0)

namespace cpf::cuda::lt {

// cuBLASLt's recommended workspace on Hopper; every call gets one of this size.
inline constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// The process-lifetime handle of `device`.
cublasLtHandle_t handle_for(int device);

// Largest power of two (up to 256) dividing every value: the alignment cuBLASLt may assume.
uint32_t alignment_of(std::initializer_list<uint64_t> values);

// A column-major description of X^T for a row-major view X (r, c) with element strides (s0, s1).
struct Operand {
  cublasOperation_t op;
  uint64_t rows, cols;
  int64_t ld;
};
// Throws unless the view is a matrix (one of its strides 1, the other covering the row or column).
Operand describe(int64_t r, int64_t c, int64_t s0, int64_t s1);

enum class Epilogue { none, bias, gelu_aux, dgelu, bgradb };

// LtGemm::b_type's default: B has A's type.
inline constexpr cudaDataType_t kSameAsA = static_cast<cudaDataType_t>(-1);

// One cuBLASLt problem, column-major: D (m, n) = op(A) (m, k) op(B) (k, n) [+ beta C], `batch` times
// with element strides between the batch entries. Everything the algorithm choice depends on, so it
// is also the algorithm cache's key.
struct LtGemm {
  int device = 0;
  cudaDataType_t ab_type = CUDA_R_32F;  // A (and B, unless b_type says otherwise)
  cudaDataType_t b_type = kSameAsA;     // B's type when it differs from A's (FP8: E4M3 x E5M2)
  cudaDataType_t cd_type = CUDA_R_32F;  // C and D (and bias, bias gradient, aux)
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = CUDA_R_32F;  // alpha / beta
  cublasOperation_t opa = CUBLAS_OP_N, opb = CUBLAS_OP_N;
  uint64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  uint32_t align_a = 256, align_b = 256, align_c = 256;
  Epilogue epilogue = Epilogue::none;
  // Alignment of the bias / bias-gradient / aux pointers. cuBLASLt's heuristic reads it from the pointer
  // values in the descriptor, so it is part of the key: an algorithm chosen for a 256-byte aligned bias
  // must not be reused for a 16-byte aligned one. run() lowers it to the pointers' own when they are less.
  uint32_t align_epilogue = 256;
  bool has_bias = false;  // gelu_aux with a bias; dgelu with the bias gradient (BGRAD)
  int64_t aux_ld = 0;
  bool accumulate = false;  // beta = 1 (D = C = the output buffer)
  bool fp8_scales = false;  // FP8 operands: A and B are scaled by LtPointers::a_scale / b_scale (device f32)
  // FP8: CUBLASLT_MATMUL_DESC_FAST_ACCUM, the partial sums not periodically promoted to f32 (faster, less exact)
  bool fp8_fast_accumulation = false;

  auto tie() const;
  bool operator<(const LtGemm& o) const;
};

// Device pointers of one call. bias: the forward bias (bias, gelu_aux); bias_grad: written (dgelu with
// has_bias, bgradb); aux: written by gelu_aux, read by dgelu.
struct LtPointers {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
  void* bias_grad = nullptr;
  void* aux = nullptr;
  const float* a_scale = nullptr;  // fp8_scales: device f32 factors of A and B (their inverse FP8 scales)
  const float* b_scale = nullptr;
};

// The alignment (a power of two up to 256) of p's epilogue pointers (bias, bias_grad, aux; 256 if none):
// what g.align_epilogue must not exceed for a call with these pointers.
uint32_t epilogue_alignment(const LtPointers& p);

// Whether cuBLASLt has an algorithm for `g` (cached per problem; the first query runs the heuristic
// with epilogue pointers aligned to exactly g.align_epilogue). Set g.align_epilogue from the call's
// pointers first (epilogue_alignment), so that run() finds the same entry.
bool supported(const LtGemm& g);

// Runs `g` on `stream` (the caller makes g.device current). `workspace`: kWorkspaceBytes of device
// memory. alpha is 1. Throws when cuBLASLt has no algorithm (ask supported() first to fall back).
void run(const LtGemm& g, const LtPointers& p, void* workspace, cudaStream_t stream, double alpha = 1.0);

}  // namespace cpf::cuda::lt
