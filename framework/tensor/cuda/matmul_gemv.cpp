// When a 2-D matmul runs as the few-row GEMV kernel (gemv.cu) instead of cuBLASLt: the forward of a
// linear layer with at most kGemvMaxRows rows (a decoding step: one row per sequence), i.e.
// out (M, N) = a (M, K) @ b with b the transposed view of a contiguous (N, K) weight, f32 or bf16
// throughout. cuBLASLt's choice for one row splits K over blocks and reduces in a second kernel; the
// GEMV reads each weight once in one kernel. CPF_GEMV=0 turns it off (for measuring against cuBLASLt).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/cuda_ops.cuh"
#include "framework/tensor/cuda/kernels.cuh"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::cuda {
namespace {

bool gemv_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("CPF_GEMV");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemv_applies(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  if (!gemv_enabled() || out.dim() != 2 || a.dim() != 2 || b.dim() != 2) return false;
  const DType dtype = out.dtype();
  if ((dtype != DType::f32 && dtype != DType::bf16) || a.dtype() != dtype || b.dtype() != dtype) return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const int64_t vector = 16 / static_cast<int64_t>(dtype_size(dtype));  // elements per 16-byte load
  if (m < 1 || m > kernels::kGemvMaxRows || k < 1 || n < 1 || b.size(0) != k || out.size(0) != m || out.size(1) != n ||
      !out.is_contiguous()) {
    return false;
  }
  // a: rows of contiguous elements; b: the transpose of a contiguous (N, K) weight.
  if (a.stride(1) != 1 || (m > 1 && a.stride(0) % vector != 0) || b.stride(0) != 1 || b.stride(1) != k) return false;
  if (k % vector != 0 || !aligned16(a.raw_data()) || !aligned16(b.raw_data())) return false;
  return !bias.defined() || (bias.dim() == 1 && bias.size(0) == n && bias.is_contiguous() && bias.dtype() == dtype);
}

void gemv(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& aux) {
  kernels::GemvLaunch g;
  g.dtype = static_cast<int>(out.dtype());
  g.a = a.raw_data();
  g.w = b.raw_data();
  g.bias = bias.defined() ? bias.raw_data() : nullptr;
  g.out = out.raw_data();
  g.aux = aux.defined() ? aux.raw_data() : nullptr;
  g.gelu = aux.defined();
  g.m = a.size(0);
  g.n = b.size(1);
  g.k = a.size(1);
  g.lda = a.size(0) > 1 ? a.stride(0) : a.size(1);
  DeviceGuard guard(out.device().index);
  kernels::launch_gemv(g, current_cuda_stream(out.device().index));
}

}  // namespace cpf::cuda
