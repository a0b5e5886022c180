// The matmul entry of the cuda kernel table: cuBLASLt GEMMs.
//
// Tensors are row-major and cuBLASLt is column-major, so C = A B is computed as C^T = B^T A^T: a
// row-major (r, c) matrix with row stride ld is a column-major (c, r) matrix with the same ld, and a
// transposed view (unit stride along rows) is the same matrix with the transpose flag set. No operand
// is copied. Batch dims are merged where their strides allow; the innermost merged batch dim becomes
// cuBLASLt's strided batch (stride 0 for a broadcast operand) and any others are looped over here.
//
// Precision: f32 computes in f32 (TF32 tensor cores only after cuda::set_allow_tf32(true)); f64 in
// f64; bf16 operands and output with f32 accumulation and f32 alpha/beta.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/cuda_ops.cuh"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/shape_utils.h"

namespace cpf::cuda {
namespace {

#define CPF_CUBLAS_CHECK(call)                                                                             \
  do {                                                                                                     \
    const cublasStatus_t cpf_status_ = (call);                                                             \
    CPF_CHECK(cpf_status_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error in ", #call, ": ",                       \
              cublasLtGetStatusString(cpf_status_), " (", cublasLtGetStatusName(cpf_status_), ")");        \
  } while (0)

// cuBLASLt's recommended workspace on Hopper.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cublasLtHandle_t handle_for(int device) {
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  cublasLtHandle_t& h = handles[static_cast<size_t>(device)];
  if (h == nullptr) {
    DeviceGuard guard(device);
    CPF_CUBLAS_CHECK(cublasLtCreate(&h));  // kept for the process's lifetime
  }
  return h;
}

// A column-major description of X^T for a row-major view X (r, c) with strides (s0, s1).
struct Operand {
  cublasOperation_t op;
  uint64_t rows, cols;
  int64_t ld;
};

Operand describe(int64_t r, int64_t c, int64_t s0, int64_t s1) {
  // Mirrors raw::matmul's mappability rules (framework/tensor/ops/matmul.cpp).
  const bool row_major = (s1 == 1 && (r <= 1 || s0 >= c)) || (c <= 1 && s0 >= 1);
  const bool col_major = (s0 == 1 && (c <= 1 || s1 >= r)) || (r <= 1 && s1 >= 1);
  if (row_major) {
    // X^T is column-major (c, r) with leading dimension s0.
    return {CUBLAS_OP_N, static_cast<uint64_t>(c), static_cast<uint64_t>(r), r <= 1 ? std::max<int64_t>(c, 1) : s0};
  }
  CPF_CHECK(col_major || (r <= 1 && c <= 1), "matmul (cuda): operand of shape [", r, ",", c, "] with strides [", s0,
            ",", s1, "] is not a matrix view (internal: raw::matmul makes such operands contiguous)");
  // X is column-major (r, c) with leading dimension s1: X^T is that matrix transposed.
  return {CUBLAS_OP_T, static_cast<uint64_t>(r), static_cast<uint64_t>(c), c <= 1 ? std::max<int64_t>(r, 1) : s1};
}

// Largest power of two (up to 256) dividing every value: the alignment cuBLASLt may assume.
uint32_t alignment_of(std::initializer_list<uint64_t> values) {
  uint32_t align = 256;
  for (uint64_t v : values) {
    while (align > 1 && v % align != 0) align >>= 1;
  }
  return align;
}

struct GemmKey {
  int device;
  int dtype;
  bool tf32;
  int opa, opb;
  uint64_t m, n, k;
  int64_t lda, ldb, ldc;
  int64_t batch, stride_a, stride_b, stride_c;
  uint32_t align_a, align_b, align_c;
  bool bias;  // CUBLASLT_EPILOGUE_BIAS: a vector of m values added to every column of C
  auto tie() const {
    return std::tie(device, dtype, tf32, opa, opb, m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c,
                    align_a, align_b, align_c, bias);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

class LayoutGuard {
 public:
  LayoutGuard(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch, int64_t stride) {
    CPF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_, type, rows, cols, ld));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      CPF_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout_, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                        sizeof(count)));
      CPF_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout_, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                        sizeof(stride)));
    }
  }
  ~LayoutGuard() { cublasLtMatrixLayoutDestroy(layout_); }
  LayoutGuard(const LayoutGuard&) = delete;
  LayoutGuard& operator=(const LayoutGuard&) = delete;
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

struct Types {
  cudaDataType_t data, scale;
  cublasComputeType_t compute;
};

Types types_for(DType dtype, bool tf32) {
  switch (dtype) {
    case DType::f32: return {CUDA_R_32F, CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
    case DType::f64: return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::bf16: return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    default: CPF_FAIL("matmul: dtype ", dtype, " has no cuda kernel (expected f32, f64 or bf16)");
  }
}

// One cuBLASLt call: `batch` products with element strides between consecutive ones.
void gemm(const GemmKey& key, DType dtype, const void* a_ptr, const void* b_ptr, void* c_ptr, const void* bias,
          void* workspace, cudaStream_t stream) {
  const Types t = types_for(dtype, key.tf32);
  cublasLtHandle_t handle = handle_for(key.device);
  cublasLtMatmulDesc_t desc = nullptr;
  CPF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, t.compute, t.scale));
  struct DescGuard {
    cublasLtMatmulDesc_t d;
    ~DescGuard() { cublasLtMatmulDescDestroy(d); }
  } desc_guard{desc};
  const auto opa = static_cast<cublasOperation_t>(key.opa), opb = static_cast<cublasOperation_t>(key.opb);
  CPF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  CPF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (key.bias) {
    // The bias has C's data type (the default): one value per row of the column-major C, i.e. per
    // column of our row-major result.
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CPF_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    CPF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  // Stored shapes: op(A') is (m, k) and op(B') is (k, n), column-major.
  const bool ta = opa == CUBLAS_OP_T, tb = opb == CUBLAS_OP_T;
  LayoutGuard la(t.data, ta ? key.k : key.m, ta ? key.m : key.k, key.lda, key.batch, key.stride_a);
  LayoutGuard lb(t.data, tb ? key.n : key.k, tb ? key.k : key.n, key.ldb, key.batch, key.stride_b);
  LayoutGuard lc(t.data, key.m, key.n, key.ldc, key.batch, key.stride_c);

  cublasLtMatmulAlgo_t algo;
  {
    static std::mutex mutex;
    static std::map<GemmKey, cublasLtMatmulAlgo_t> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it == cache.end()) {
      cublasLtMatmulPreference_t pref = nullptr;
      CPF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      struct PrefGuard {
        cublasLtMatmulPreference_t p;
        ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
      } pref_guard{pref};
      const uint64_t ws = kWorkspaceBytes;
      CPF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                            sizeof(ws)));
      CPF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                            &key.align_a, sizeof(key.align_a)));
      CPF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                            &key.align_b, sizeof(key.align_b)));
      CPF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                            &key.align_c, sizeof(key.align_c)));
      CPF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                            &key.align_c, sizeof(key.align_c)));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      CPF_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, la.get(), lb.get(), lc.get(), lc.get(), pref, 1,
                                                      &result, &found));
      CPF_CHECK(found > 0, "matmul (cuda): cuBLASLt has no algorithm for m=", key.m, " n=", key.n, " k=", key.k,
                " batch=", key.batch, " dtype ", dtype);
      it = cache.emplace(key, result.algo).first;
    }
    algo = it->second;
  }
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const void* alpha = dtype == DType::f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = dtype == DType::f64 ? static_cast<const void*>(&zero_d) : &zero_f;
  CPF_CUBLAS_CHECK(cublasLtMatmul(handle, desc, alpha, a_ptr, la.get(), b_ptr, lb.get(), beta, c_ptr, lc.get(), c_ptr,
                                  lc.get(), &algo, workspace, kWorkspaceBytes, stream));
}

// How one matmul runs: the cuBLASLt key of its innermost (strided) batch and the outer batch dims
// looped over here, with the element strides of (out, a, b) along each.
struct GemmPlan {
  GemmKey key{};
  Shape sizes;                   // batch dims after merging; the last is cuBLASLt's strided batch
  std::array<Shape, 3> strides;  // out, a, b
};

// The batch dims of out (the broadcast of a's and b's) merged where every operand's strides allow.
void merge_batch_dims(const Tensor& out, const Tensor& a, const Tensor& b, GemmPlan& plan) {
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  auto batch_strides = [&](const Tensor& t) {
    Shape st(batch.size(), 0);
    const int64_t lead = static_cast<int64_t>(batch.size()) - (t.dim() - 2);
    for (int64_t d = 0; d < t.dim() - 2; ++d) {
      if (t.size(d) != 1) st[static_cast<size_t>(d + lead)] = t.stride(d);
    }
    return st;
  };
  const std::array<Shape, 3> full{batch_strides(out), batch_strides(a), batch_strides(b)};
  for (size_t d = 0; d < batch.size(); ++d) {
    if (batch[d] == 1) continue;
    if (!plan.sizes.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < 3; ++k) mergeable &= plan.strides[k].back() == full[k][d] * batch[d];
      if (mergeable) {
        plan.sizes.back() *= batch[d];
        for (size_t k = 0; k < 3; ++k) plan.strides[k].back() = full[k][d];
        continue;
      }
    }
    plan.sizes.push_back(batch[d]);
    for (size_t k = 0; k < 3; ++k) plan.strides[k].push_back(full[k][d]);
  }
  if (plan.sizes.empty()) {
    plan.sizes.push_back(1);
    for (auto& st : plan.strides) st.push_back(0);
  }
}

GemmPlan plan_gemm(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  GemmPlan plan;
  merge_batch_dims(out, a, b, plan);
  // C^T (N, M) = B^T A^T: cuBLASLt's A is our b, its B is our a.
  const Operand ob = describe(K, N, b.stride(-2), b.stride(-1));
  const Operand oa = describe(M, K, a.stride(-2), a.stride(-1));
  const size_t es = dtype_size(out.dtype());
  GemmKey& key = plan.key;
  key.device = out.device().index;
  key.dtype = static_cast<int>(out.dtype());
  key.tf32 = out.dtype() == DType::f32 && allow_tf32();
  key.opa = ob.op;
  key.opb = oa.op;
  key.m = static_cast<uint64_t>(N);
  key.n = static_cast<uint64_t>(M);
  key.k = static_cast<uint64_t>(K);
  key.lda = ob.ld;
  key.ldb = oa.ld;
  key.ldc = N;
  key.batch = plan.sizes.back();
  key.stride_a = plan.strides[2].back();
  key.stride_b = plan.strides[1].back();
  key.stride_c = plan.strides[0].back();
  // Every pointer a call may get (base plus any batch offset) and the leading dims share this alignment.
  auto align = [&](const void* base, const Shape& batch_strides, int64_t ld) {
    uint32_t al = alignment_of({reinterpret_cast<uintptr_t>(base), static_cast<uint64_t>(ld) * es});
    for (int64_t st : batch_strides) al = std::min(al, alignment_of({static_cast<uint64_t>(st) * es}));
    return al;
  };
  key.align_a = align(b.raw_data(), plan.strides[2], ob.ld);
  key.align_b = align(a.raw_data(), plan.strides[1], oa.ld);
  key.align_c = align(out.raw_data(), plan.strides[0], N);
  return plan;
}

// One cuBLASLt call per index of the outer (non-merged) batch dims.
void run_gemm(const GemmPlan& plan, const Tensor& out, const Tensor& a, const Tensor& b, const void* bias) {
  DeviceGuard guard(plan.key.device);
  cudaStream_t stream = current_cuda_stream(plan.key.device);
  const size_t outer_dims = plan.sizes.size() - 1;
  int64_t outer = 1;
  for (size_t d = 0; d < outer_dims; ++d) outer *= plan.sizes[d];
  Tensor workspace = empty({static_cast<int64_t>(kWorkspaceBytes)}, {.dtype = DType::boolean, .device = out.device()});
  const auto es = static_cast<int64_t>(dtype_size(out.dtype()));
  auto* pa = static_cast<const char*>(a.raw_data());
  auto* pb = static_cast<const char*>(b.raw_data());
  auto* pc = static_cast<char*>(out.raw_data());
  for (int64_t i = 0; i < outer; ++i) {
    int64_t rest = i, off_c = 0, off_a = 0, off_b = 0;
    for (int64_t d = static_cast<int64_t>(outer_dims) - 1; d >= 0; --d) {
      const auto du = static_cast<size_t>(d);
      const int64_t idx = rest % plan.sizes[du];
      rest /= plan.sizes[du];
      off_c += idx * plan.strides[0][du];
      off_a += idx * plan.strides[1][du];
      off_b += idx * plan.strides[2][du];
    }
    gemm(plan.key, out.dtype(), pb + off_b * es, pa + off_a * es, pc + off_c * es, bias, workspace.raw_data(), stream);
  }
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  run_gemm(plan_gemm(out, a, b), out, a, b, nullptr);
}

void matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  CPF_CHECK(out.dim() == 2 && a.dim() == 2 && b.dim() == 2 && bias.dim() == 1 && bias.size(0) == b.size(1) &&
                bias.is_contiguous() && reinterpret_cast<uintptr_t>(bias.raw_data()) % 16 == 0 &&
                (out.dtype() == DType::f32 || out.dtype() == DType::bf16) && bias.dtype() == out.dtype(),
            "matmul_bias (cuda): needs 2-D f32/bf16 operands and a contiguous, 16-byte aligned bias of out's dtype, "
            "got a ", a.shape(), " b ", b.shape(), " bias ", bias.shape(), " ", bias.dtype(),
            " (internal: raw::linear prepares these)");
  GemmPlan plan = plan_gemm(out, a, b);
  plan.key.bias = true;
  run_gemm(plan, out, a, b, bias.raw_data());
}

}  // namespace cpf::cuda
