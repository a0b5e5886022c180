// cuBLASLt calls of the unfused attention path (unfused_gemm.cuh).
//
// cuBLASLt is column-major. A row-major (r x c) matrix with row stride ld is the column-major
// (c x r) matrix with leading dimension ld, so C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T: cuBLASLt's first operand is our B, its second our A, its (m, n) our (n, m).
// A row-major operand stored as op(X) is column-major op(X)^T (no transpose flag); one stored
// transposed is column-major op(X) and takes CUBLAS_OP_T.
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>
#include <tuple>

#include "attention/cuda/unfused_gemm.cuh"
#include "framework/core/error.h"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::attention_cuda::unfused {
namespace {

#define CPF_UNFUSED_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                                     \
    const cublasStatus_t cpf_status_ = (call);                                                             \
    CPF_CHECK(cpf_status_ == CUBLAS_STATUS_SUCCESS, "attention (unfused): cuBLASLt error in ", #call, ": ", \
              cublasLtGetStatusString(cpf_status_), " (", cublasLtGetStatusName(cpf_status_), ")");        \
  } while (0)

cublasLtHandle_t handle_for(int device) {
  static std::array<cublasLtHandle_t, cuda::kMaxDevices> handles{};
  static std::mutex mutex;
  CPF_CHECK(device >= 0 && device < cuda::kMaxDevices, "attention (unfused): device index ", device,
            " out of range [0, ", cuda::kMaxDevices, ")");
  std::lock_guard<std::mutex> lock(mutex);
  cublasLtHandle_t& h = handles[static_cast<size_t>(device)];
  if (h == nullptr) CPF_UNFUSED_CUBLAS_CHECK(cublasLtCreate(&h));  // kept for the process's lifetime
  return h;
}

// Largest power of two (up to 256) dividing every value: the alignment cuBLASLt may assume.
uint32_t alignment_of(std::initializer_list<uint64_t> values) {
  uint32_t align = 256;
  for (uint64_t v : values) {
    while (align > 1 && v % align != 0) align >>= 1;
  }
  return align;
}

// Everything the heuristic's choice depends on.
struct Key {
  int device, dtype, compute;
  int op_first, op_second;  // cuBLASLt's operands: ours B, then A
  int64_t m, n, k, batch;
  int64_t ld_first, ld_second, ld_c;
  int64_t stride_first, stride_second, stride_c;
  uint32_t align_first, align_second, align_c;
  auto tie() const {
    return std::tie(device, dtype, compute, op_first, op_second, m, n, k, batch, ld_first, ld_second, ld_c,
                    stride_first, stride_second, stride_c, align_first, align_second, align_c);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

template <class Destroy, class Handle>
struct Owned {
  Handle h = nullptr;
  Destroy destroy;
  ~Owned() {
    if (h) destroy(h);
  }
};

struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
    CPF_UNFUSED_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&h, type, static_cast<uint64_t>(rows),
                                                        static_cast<uint64_t>(cols), ld));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      CPF_UNFUSED_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      CPF_UNFUSED_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(h); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

}  // namespace

void gemm(int device, DType dtype, bool tf32, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
          const GemmOperand& a, const GemmOperand& b, double beta, const GemmOutput& c, void* workspace,
          cudaStream_t stream) {
  CPF_CHECK(dtype == DType::f32 || dtype == DType::f64, "attention (unfused): gemm computes in f32 or f64, got ",
            dtype);
  CPF_CHECK(batch > 0 && m > 0 && n > 0 && k > 0 && batch <= INT32_MAX, "attention (unfused): gemm sizes must be "
            "positive: batch=", batch, " m=", m, " n=", n, " k=", k);
  const cudaDataType_t type = dtype == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  const cublasComputeType_t compute = dtype == DType::f64 ? CUBLAS_COMPUTE_64F
                                      : tf32                ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                            : CUBLAS_COMPUTE_32F;
  const uint64_t es = dtype_size(dtype);

  Key key{};
  key.device = device;
  key.dtype = static_cast<int>(dtype);
  key.compute = static_cast<int>(compute);
  key.op_first = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  key.op_second = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  key.m = n;
  key.n = m;
  key.k = k;
  key.batch = batch;
  key.ld_first = b.ld;
  key.ld_second = a.ld;
  key.ld_c = c.ld;
  key.stride_first = batch > 1 ? b.batch_stride : 0;
  key.stride_second = batch > 1 ? a.batch_stride : 0;
  key.stride_c = batch > 1 ? c.batch_stride : 0;
  auto align = [&](const void* p, int64_t ld, int64_t stride) {
    return alignment_of({reinterpret_cast<uint64_t>(p), static_cast<uint64_t>(ld) * es,
                         static_cast<uint64_t>(stride) * es});
  };
  key.align_first = align(b.data, b.ld, key.stride_first);
  key.align_second = align(a.data, a.ld, key.stride_second);
  key.align_c = align(c.data, c.ld, key.stride_c);

  cublasLtHandle_t handle = handle_for(device);
  Owned<decltype(&cublasLtMatmulDescDestroy), cublasLtMatmulDesc_t> desc{nullptr, &cublasLtMatmulDescDestroy};
  CPF_UNFUSED_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, compute, type));
  const auto op_first = static_cast<cublasOperation_t>(key.op_first);
  const auto op_second = static_cast<cublasOperation_t>(key.op_second);
  CPF_UNFUSED_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  CPF_UNFUSED_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  // Stored (column-major) shapes: the first operand is op_first^-1 of (m' x k), the second of (k x n').
  const bool t1 = op_first == CUBLAS_OP_T, t2 = op_second == CUBLAS_OP_T;
  const Layout l1(type, t1 ? key.k : key.m, t1 ? key.m : key.k, key.ld_first, batch, key.stride_first);
  const Layout l2(type, t2 ? key.n : key.k, t2 ? key.k : key.n, key.ld_second, batch, key.stride_second);
  const Layout lc(type, key.m, key.n, key.ld_c, batch, key.stride_c);

  cublasLtMatmulAlgo_t algo;
  {
    static std::mutex mutex;
    static std::map<Key, cublasLtMatmulAlgo_t> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it == cache.end()) {
      Owned<decltype(&cublasLtMatmulPreferenceDestroy), cublasLtMatmulPreference_t> pref{
          nullptr, &cublasLtMatmulPreferenceDestroy};
      CPF_UNFUSED_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
      const uint64_t ws = kGemmWorkspaceBytes;
      CPF_UNFUSED_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                    &ws, sizeof(ws)));
      // The heuristic assumes 256-byte aligned operands unless told otherwise.
      const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>, 4> aligns{{
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_first},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_second},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c},
      }};
      for (const auto& [attr, value] : aligns) {
        CPF_UNFUSED_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, attr, &value, sizeof(value)));
      }
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      CPF_UNFUSED_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc.h, l1.h, l2.h, lc.h, lc.h, pref.h, 1,
                                                              &result, &found));
      CPF_CHECK(found > 0, "attention (unfused): cuBLASLt has no algorithm for m=", m, " n=", n, " k=", k,
                " batch=", batch, " dtype ", dtype);
      it = cache.emplace(key, result.algo).first;
    }
    algo = it->second;
  }
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const void* alpha_p = dtype == DType::f64 ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* beta_p = dtype == DType::f64 ? static_cast<const void*>(&beta) : &beta_f;
  CPF_UNFUSED_CUBLAS_CHECK(cublasLtMatmul(handle, desc.h, alpha_p, b.data, l1.h, a.data, l2.h, beta_p, c.data, lc.h,
                                          c.data, lc.h, &algo, workspace, kGemmWorkspaceBytes, stream));
}

}  // namespace cpf::attention_cuda::unfused
