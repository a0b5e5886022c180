#include "framework/tensor/ops/linear.h"

#include <cstdint>

#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

void check_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_defined(x, "linear", "x");
  check_defined(weight, "linear", "weight");
  CPF_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1), "linear: x ", x.shape(),
            " must end in in_features and weight must be (out_features, in_features) = (N, ", x.size(-1),
            "), got weight ", weight.shape());
  check_same_dtype(x, weight, "linear");
  check_same_device(x, weight, "linear");
  if (!bias.defined()) return;
  CPF_CHECK(bias.shape() == Shape{weight.size(0)}, "linear: bias must have shape [", weight.size(0),
            "] (out_features), got ", bias.shape());
  check_same_dtype(x, bias, "linear");
  check_same_device(x, bias, "linear");
}

// The device path: one GEMM with the bias in its epilogue, for f32 and bf16 (cuBLASLt has no f64
// bias epilogue) on a 2-D view of x.
bool fused_bias_applies(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return bias.defined() && !x.device().is_cpu() && x.numel() > 0 && weight.numel() > 0 &&
         (x.dtype() == DType::f32 || x.dtype() == DType::bf16) && has_kernel(x.device(), &DeviceOps::matmul_bias);
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear(x, weight, bias);
  const int64_t in = weight.size(1), out = weight.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out;
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  const Tensor x2 = reshape(contiguous(x), {rows, in});  // (M, K)
  const Tensor w_t = transpose(weight, 0, 1);            // (K, N) view
  if (fused_bias_applies(x, weight, bias)) {
    Tensor y = empty({rows, out}, {.dtype = x.dtype(), .device = x.device()});  // (M, N)
    // cuBLASLt reads the bias vector with wide loads: a view at an odd offset gets an aligned copy.
    const bool aligned = bias.is_contiguous() && reinterpret_cast<uintptr_t>(bias.raw_data()) % 16 == 0;
    device_kernel(x.device(), &DeviceOps::matmul_bias, "linear")(y, x2, w_t, aligned ? bias : clone(bias));
    return reshape(y, out_shape);
  }
  Tensor y = matmul(x2, w_t);  // (M, N)
  if (bias.defined()) y = binary(BinaryOp::add, y, bias);
  return reshape(y, out_shape);
}

}  // namespace cpf::raw
