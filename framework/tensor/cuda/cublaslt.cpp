// The cuBLASLt layer (cublaslt.cuh): handles, layouts, epilogue attributes and the algorithm cache.
#include "framework/tensor/cuda/cublaslt.cuh"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::cuda::lt {
namespace {

template <class Handle, cublasStatus_t (*Destroy)(Handle)>
struct Owned {
  Handle h = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (h != nullptr) Destroy(h);
  }
};
using Desc = Owned<cublasLtMatmulDesc_t, &cublasLtMatmulDescDestroy>;
using Layout = Owned<cublasLtMatrixLayout_t, &cublasLtMatrixLayoutDestroy>;
using Pref = Owned<cublasLtMatmulPreference_t, &cublasLtMatmulPreferenceDestroy>;

void make_layout(Layout& l, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch,
                 int64_t stride) {
  CPF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l.h, type, rows, cols, ld));
  if (batch <= 1) return;
  const auto count = static_cast<int32_t>(batch);
  CPF_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  CPF_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

template <class T>
void set_attr(const Desc& d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  CPF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.h, attr, &value, sizeof(value)));
}

cublasLtEpilogue_t epilogue_code(const LtGemm& g) {
  switch (g.epilogue) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_aux: return g.has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::dgelu: return g.has_bias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::bgradb: return CUBLASLT_EPILOGUE_BGRADB;
  }
  CPF_FAIL("cuBLASLt: unknown epilogue ", static_cast<int>(g.epilogue));
}

// The descriptor and the three layouts of one problem. Pointers set here (bias, aux) matter to the
// heuristic only through their alignment, which the key holds (align_epilogue).
struct Problem {
  Desc desc;
  Layout a, b, c;

  Problem(const LtGemm& g, const LtPointers& p) {
    CPF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, g.compute, g.scale_type));
    set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSA, g.opa);
    set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSB, g.opb);
    if (g.epilogue != Epilogue::none) {
      set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue_code(g));
      const bool writes_grad = g.epilogue == Epilogue::bgradb || (g.epilogue == Epilogue::dgelu && g.has_bias);
      const void* vector = writes_grad ? static_cast<const void*>(p.bias_grad) : p.bias;
      // Only epilogues that read or write the vector get one (the heuristic's placeholders are all non-null).
      const bool uses_vector = g.epilogue == Epilogue::bias || g.epilogue == Epilogue::bgradb || g.has_bias;
      if (uses_vector && vector != nullptr) set_attr(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vector);
      if (g.epilogue == Epilogue::gelu_aux || g.epilogue == Epilogue::dgelu) {
        set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
        set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld);
      }
    }
    if (g.fp8_scales && p.a_scale != nullptr) {
      set_attr(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.a_scale));
      set_attr(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.b_scale));
    }
    if (g.fp8_fast_accumulation) set_attr(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{1});
    const bool ta = g.opa == CUBLAS_OP_T, tb = g.opb == CUBLAS_OP_T;
    const cudaDataType_t b_type = g.b_type == kSameAsA ? g.ab_type : g.b_type;
    make_layout(a, g.ab_type, ta ? g.k : g.m, ta ? g.m : g.k, g.lda, g.batch, g.stride_a);
    make_layout(b, b_type, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, g.batch, g.stride_b);
    make_layout(c, g.cd_type, g.m, g.n, g.ldc, g.batch, g.stride_c);
  }
};

// Placeholder epilogue pointers whose alignment is exactly `align` (the heuristic reads only that).
LtPointers heuristic_pointers(uint32_t align) {
  alignas(512) static const char dummy[1024] = {};
  void* p = const_cast<char*>(dummy);
  void* v = const_cast<char*>(dummy + align);  // dummy is 512-aligned: dummy + align is aligned to align only
  return LtPointers{.a = p, .b = p, .d = p, .bias = v, .bias_grad = v, .aux = v};
}

// The heuristic's first choice for `g`, or nullopt when it has none; cached per problem. The heuristic
// runs with epilogue pointers aligned to exactly g.align_epilogue, so its choice holds for every call
// whose pointers are at least that aligned, whatever the first caller's were.
std::optional<cublasLtMatmulAlgo_t> algorithm(const LtGemm& g) {
  static std::mutex mutex;
  static std::map<LtGemm, std::optional<cublasLtMatmulAlgo_t>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(g);
  if (it != cache.end()) return it->second;
  const Problem problem(g, heuristic_pointers(g.align_epilogue));
  Pref pref;
  CPF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
  const uint64_t ws = kWorkspaceBytes;
  CPF_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The heuristic assumes 256-byte aligned operands unless told otherwise.
  const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>, 4> aligns{{
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.align_c},
  }};
  for (const auto& [attr, value] : aligns) {
    CPF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.h, attr, &value, sizeof(value)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_for(g.device), problem.desc.h, problem.a.h, problem.b.h, problem.c.h,
                                     problem.c.h, pref.h, 1, &result, &found);
  // NOT_SUPPORTED: no kernel for this combination. An epilogue cuBLASLt rejects on this problem
  // (INVALID_VALUE for a layout it does not take, say) counts as unsupported too: the caller falls
  // back to the unfused ops. A plain GEMM it rejects is an error.
  const bool unsupported =
      status == CUBLAS_STATUS_NOT_SUPPORTED || (g.epilogue != Epilogue::none && status == CUBLAS_STATUS_INVALID_VALUE);
  CPF_CHECK(status == CUBLAS_STATUS_SUCCESS || unsupported,
            "cuBLAS error in cublasLtMatmulAlgoGetHeuristic: ", cublasLtGetStatusString(status), " (",
            cublasLtGetStatusName(status), ")");
  std::optional<cublasLtMatmulAlgo_t> algo;
  if (status == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
  return cache.emplace(g, algo).first->second;
}

}  // namespace

auto LtGemm::tie() const {
  return std::tie(device, ab_type, b_type, cd_type, compute, scale_type, opa, opb, m, n, k, lda, ldb, ldc, batch,
                  stride_a, stride_b, stride_c, align_a, align_b, align_c, epilogue, align_epilogue, has_bias, aux_ld,
                  accumulate, fp8_scales, fp8_fast_accumulation);
}

bool LtGemm::operator<(const LtGemm& o) const { return tie() < o.tie(); }

cublasLtHandle_t handle_for(int device) {
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  static std::mutex mutex;
  CPF_CHECK(device >= 0 && device < kMaxDevices, "cuBLASLt: device index ", device, " out of range [0, ", kMaxDevices,
            ")");
  std::lock_guard<std::mutex> lock(mutex);
  cublasLtHandle_t& h = handles[static_cast<size_t>(device)];
  if (h == nullptr) {
    DeviceGuard guard(device);
    CPF_CUBLAS_CHECK(cublasLtCreate(&h));  // kept for the process's lifetime
  }
  return h;
}

uint32_t alignment_of(std::initializer_list<uint64_t> values) {
  uint32_t align = 256;
  for (uint64_t v : values) {
    while (align > 1 && v % align != 0) align >>= 1;
  }
  return align;
}

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

uint32_t epilogue_alignment(const LtPointers& p) {
  uint32_t align = 256;
  for (const void* v : {p.bias, static_cast<const void*>(p.bias_grad), static_cast<const void*>(p.aux)}) {
    if (v != nullptr) align = std::min(align, alignment_of({reinterpret_cast<uintptr_t>(v)}));
  }
  return align;
}

bool supported(const LtGemm& g) { return algorithm(g).has_value(); }

void run(const LtGemm& g, const LtPointers& p, void* workspace, cudaStream_t stream, double alpha) {
  LtGemm key = g;  // the heuristic's choice for pointers no more aligned than these
  key.align_epilogue = std::min(g.align_epilogue, epilogue_alignment(p));
  const Problem problem(g, p);
  const std::optional<cublasLtMatmulAlgo_t> algo = algorithm(key);
  CPF_CHECK(algo.has_value(), "cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k, " batch=", g.batch,
            " epilogue ", static_cast<int>(g.epilogue), " (A/B type ", static_cast<int>(g.ab_type), ", D type ",
            static_cast<int>(g.cd_type), ")");
  const double beta = g.accumulate ? 1.0 : 0.0;
  const auto alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const bool f64 = g.scale_type == CUDA_R_64F;
  const void* alpha_p = f64 ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* beta_p = f64 ? static_cast<const void*>(&beta) : &beta_f;
  CPF_CUBLAS_CHECK(cublasLtMatmul(handle_for(g.device), problem.desc.h, alpha_p, p.a, problem.a.h, p.b, problem.b.h,
                                  beta_p, p.d, problem.c.h, p.d, problem.c.h, &*algo, workspace, kWorkspaceBytes,
                                  stream));
}

}  // namespace cpf::cuda::lt
