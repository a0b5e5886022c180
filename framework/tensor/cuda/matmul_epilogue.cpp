// DeviceOps::matmul_epilogue: one 2-D GEMM with a cuBLASLt epilogue (device_ops.h, DeviceGemmArgs).
//
// In cuBLASLt's column-major terms (gemm_plan.cuh) our out (M, N) is D (N, M): our columns are D's
// rows. So the forward bias and the dgelu bias gradient (one value per column of out) are cuBLASLt's
// per-row vectors (BIAS, DGELU_BGRAD), the aux matrix (M, N) has leading dimension N, and the row sums
// of our a (M, K) are the sums of cuBLASLt's op(B) over k (BGRADB: our a is its B).
#include <cstdint>

#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/cuda_ops.cuh"
#include "framework/tensor/cuda/gemm_plan.cuh"

namespace cpf::cuda {
namespace {

const char* epilogue_name(DeviceGemmEpilogue e) {
  switch (e) {
    case DeviceGemmEpilogue::none: return "none";
    case DeviceGemmEpilogue::gelu: return "gelu";
    case DeviceGemmEpilogue::dgelu: return "dgelu";
  }
  return "?";
}

// A vector cuBLASLt reads or writes with wide accesses: contiguous, 16-byte aligned, of out's dtype.
void check_vector(const Tensor& v, int64_t n, const Tensor& out, const char* what, DeviceGemmEpilogue e) {
  CPF_CHECK(v.dim() == 1 && v.size(0) == n && v.is_contiguous() && v.dtype() == out.dtype() &&
                reinterpret_cast<uintptr_t>(v.raw_data()) % 16 == 0,
            "matmul_epilogue (cuda, ", epilogue_name(e), "): ", what, " must be a contiguous, 16-byte aligned (", n,
            ") vector of ", out.dtype(), ", got ", v.shape(), " ", v.dtype());
}

void check_args(const Tensor& out, const Tensor& a, const Tensor& b, const DeviceGemmArgs& g) {
  const DeviceGemmEpilogue e = g.epilogue;
  CPF_CHECK(out.dim() == 2 && a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0) && out.size(0) == a.size(0) &&
                out.size(1) == b.size(1) && out.is_contiguous() && out.numel() > 0 && a.size(1) > 0,
            "matmul_epilogue (cuda, ", epilogue_name(e),
            "): needs out (M, N) = a (M, K) @ b (K, N) with M, N, K > 0 "
            "and a contiguous out, got out ",
            out.shape(), " a ", a.shape(), " b ", b.shape());
  const bool same = out.dtype() == a.dtype() && (a.dtype() == DType::f32 || a.dtype() == DType::bf16);
  const bool widening = out.dtype() == DType::f32 && a.dtype() == DType::bf16 && e == DeviceGemmEpilogue::none;
  CPF_CHECK(a.dtype() == b.dtype() && (same || widening), "matmul_epilogue (cuda, ", epilogue_name(e), "): operands ",
            a.dtype(), "/", b.dtype(), " with output ", out.dtype(),
            " are not supported (f32 or bf16 throughout; an f32 output of bf16 operands with epilogue none only)");
  const int64_t M = out.size(0), N = out.size(1);
  CPF_CHECK(!g.accumulate || e == DeviceGemmEpilogue::none, "matmul_epilogue (cuda, ", epilogue_name(e),
            "): accumulate is supported with epilogue none only");
  if (e != DeviceGemmEpilogue::none) {
    // cuBLASLt: the GELU aux matrix's leading dimension (our N) must be a multiple of 8.
    CPF_CHECK(N % 8 == 0, "matmul_epilogue (cuda, ", epilogue_name(e), "): out ", out.shape(), " has N = ", N,
              " columns; cuBLASLt's GELU epilogues need N to be a multiple of 8 "
              "(run the GEMM and the activation unfused for this shape)");
    CPF_CHECK(g.aux.defined() && g.aux.shape() == out.shape() && g.aux.is_contiguous() && g.aux.dtype() == out.dtype(),
              "matmul_epilogue (cuda, ", epilogue_name(e), "): aux must be a contiguous ", out.shape(), " ",
              out.dtype(), " tensor, got ", g.aux.defined() ? g.aux.shape() : Shape{});
  }
  if (g.bias.defined()) {
    CPF_CHECK(e == DeviceGemmEpilogue::gelu, "matmul_epilogue (cuda, ", epilogue_name(e),
              "): a forward bias goes with the gelu epilogue only (matmul_bias adds one to a plain GEMM)");
    check_vector(g.bias, N, out, "bias", e);
  }
  if (g.bias_grad.defined()) {
    CPF_CHECK(e != DeviceGemmEpilogue::gelu,
              "matmul_epilogue (cuda, gelu): a bias gradient is written by the "
              "dgelu epilogue or beside a plain GEMM, not by gelu");
    check_vector(g.bias_grad, e == DeviceGemmEpilogue::dgelu ? N : M, out, "bias_grad", e);
  }
}

lt::LtGemm with_epilogue(lt::LtGemm gemm, const DeviceGemmArgs& g, int64_t n) {
  gemm.accumulate = g.accumulate;
  switch (g.epilogue) {
    case DeviceGemmEpilogue::none:
      if (g.bias_grad.defined()) gemm.epilogue = lt::Epilogue::bgradb;
      break;
    case DeviceGemmEpilogue::gelu:
      gemm.epilogue = lt::Epilogue::gelu_aux;
      gemm.has_bias = g.bias.defined();
      gemm.aux_ld = n;
      break;
    case DeviceGemmEpilogue::dgelu:
      gemm.epilogue = lt::Epilogue::dgelu;
      gemm.has_bias = g.bias_grad.defined();
      gemm.aux_ld = n;
      break;
  }
  return gemm;
}

}  // namespace

bool matmul_epilogue(const Tensor& out, const Tensor& a, const Tensor& b, const DeviceGemmArgs& args) {
  check_args(out, a, b, args);
  if (args.epilogue == DeviceGemmEpilogue::gelu && !args.accumulate && gemv_applies(out, a, b, args.bias)) {
    gemv(out, a, b, args.bias, args.aux);  // a few rows: the GEMV kernel with the GELU epilogue
    return true;
  }
  GemmPlan plan = plan_gemm(out, a, b);
  plan.gemm = with_epilogue(plan.gemm, args, out.size(1));
  lt::LtPointers extra;  // a, b, d: filled in by run_gemm
  extra.bias = args.bias.defined() ? args.bias.raw_data() : nullptr;
  extra.bias_grad = args.bias_grad.defined() ? args.bias_grad.raw_data() : nullptr;
  extra.aux = args.aux.defined() ? args.aux.raw_data() : nullptr;
  // The heuristic's answer for these pointers' alignment (run() looks up the same cache entry).
  plan.gemm.align_epilogue = lt::epilogue_alignment(extra);
  if (!lt::supported(plan.gemm)) return false;
  run_gemm(plan, out, a, b, extra);
  return true;
}

}  // namespace cpf::cuda
