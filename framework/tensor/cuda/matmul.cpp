// The matmul entries of the cuda kernel table (DeviceOps::matmul, matmul_bias) and the row-major ->
// cuBLASLt mapping they share with matmul_epilogue.cpp (gemm_plan.cuh). No operand is copied: a
// transposed view is the same matrix with the transpose flag set.
//
// Precision: f32 computes in f32 (TF32 tensor cores only after cuda::set_allow_tf32(true)); f64 in
// f64; bf16 operands with f32 accumulation and f32 alpha/beta, written as bf16 or (gradients) f32.
#include <algorithm>
#include <array>
#include <vector>

#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/cuda_ops.cuh"
#include "framework/tensor/cuda/gemm_plan.cuh"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/shape_utils.h"

namespace cpf::cuda {
namespace {

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

}  // namespace

GemmPlan plan_gemm(const Tensor& out, const Tensor& a, const Tensor& b) {
  CPF_CHECK(
      a.dtype() == b.dtype() && (out.dtype() == a.dtype() || (out.dtype() == DType::f32 && a.dtype() == DType::bf16)),
      "matmul (cuda): operands ", a.dtype(), " and ", b.dtype(), " with output ", out.dtype(),
      " (internal: expected one dtype, or bf16 operands with an f32 output)");
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  GemmPlan plan;
  merge_batch_dims(out, a, b, plan);
  // out^T (N, M) = b^T a^T: cuBLASLt's A is our b, its B is our a.
  const lt::Operand ob = lt::describe(K, N, b.stride(-2), b.stride(-1));
  const lt::Operand oa = lt::describe(M, K, a.stride(-2), a.stride(-1));
  const Types in = types_for(a.dtype(), a.dtype() == DType::f32 && allow_tf32());
  lt::LtGemm& g = plan.gemm;
  g.device = out.device().index;
  g.ab_type = in.data;
  g.cd_type = types_for(out.dtype(), false).data;
  g.compute = in.compute;
  g.scale_type = in.scale;
  g.opa = ob.op;
  g.opb = oa.op;
  g.m = static_cast<uint64_t>(N);
  g.n = static_cast<uint64_t>(M);
  g.k = static_cast<uint64_t>(K);
  g.lda = ob.ld;
  g.ldb = oa.ld;
  g.ldc = N;
  g.batch = plan.sizes.back();
  g.stride_a = plan.strides[2].back();
  g.stride_b = plan.strides[1].back();
  g.stride_c = plan.strides[0].back();
  // Every pointer a call may get (base plus any batch offset) and the leading dims share this alignment.
  auto align = [&](const Tensor& t, const Shape& batch_strides, int64_t ld) {
    const auto es = static_cast<uint64_t>(dtype_size(t.dtype()));
    uint32_t al = lt::alignment_of({reinterpret_cast<uintptr_t>(t.raw_data()), static_cast<uint64_t>(ld) * es});
    for (int64_t st : batch_strides) al = std::min(al, lt::alignment_of({static_cast<uint64_t>(st) * es}));
    return al;
  };
  g.align_a = align(b, plan.strides[2], ob.ld);
  g.align_b = align(a, plan.strides[1], oa.ld);
  g.align_c = align(out, plan.strides[0], N);
  return plan;
}

void run_gemm(const GemmPlan& plan, const Tensor& out, const Tensor& a, const Tensor& b, const lt::LtPointers& extra) {
  DeviceGuard guard(plan.gemm.device);
  cudaStream_t stream = current_cuda_stream(plan.gemm.device);
  const size_t outer_dims = plan.sizes.size() - 1;
  int64_t outer = 1;
  for (size_t d = 0; d < outer_dims; ++d) outer *= plan.sizes[d];
  Tensor workspace =
      empty({static_cast<int64_t>(lt::kWorkspaceBytes)}, {.dtype = DType::boolean, .device = out.device()});
  const auto es_in = static_cast<int64_t>(dtype_size(a.dtype()));
  const auto es_out = static_cast<int64_t>(dtype_size(out.dtype()));
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
    lt::LtPointers p = extra;
    p.a = pb + off_b * es_in;
    p.b = pa + off_a * es_in;
    p.d = pc + off_c * es_out;
    lt::run(plan.gemm, p, workspace.raw_data(), stream);
  }
}

void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (gemv_applies(out, a, b, Tensor())) return gemv(out, a, b, Tensor(), Tensor());
  run_gemm(plan_gemm(out, a, b), out, a, b, {});
}

void matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  CPF_CHECK(out.dim() == 2 && a.dim() == 2 && b.dim() == 2 && bias.dim() == 1 && bias.size(0) == b.size(1) &&
                bias.is_contiguous() && reinterpret_cast<uintptr_t>(bias.raw_data()) % 16 == 0 &&
                (out.dtype() == DType::f32 || out.dtype() == DType::bf16) && bias.dtype() == out.dtype(),
            "matmul_bias (cuda): needs 2-D f32/bf16 operands and a contiguous, 16-byte aligned bias of out's dtype, "
            "got a ",
            a.shape(), " b ", b.shape(), " bias ", bias.shape(), " ", bias.dtype(),
            " (internal: raw::linear prepares these)");
  if (gemv_applies(out, a, b, bias)) return gemv(out, a, b, bias, Tensor());
  GemmPlan plan = plan_gemm(out, a, b);
  // The bias has D's data type: one value per row of the column-major D, i.e. per column of out.
  plan.gemm.epilogue = lt::Epilogue::bias;
  lt::LtPointers extra;
  extra.bias = bias.raw_data();
  run_gemm(plan, out, a, b, extra);
}

}  // namespace cpf::cuda
