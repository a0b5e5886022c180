#include "framework/tensor/ops/linear.h"

#include <cstdint>

#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/linear_common.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

void check_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const char* op) {
  check_defined(x, op, "x");
  check_defined(weight, op, "weight");
  CPF_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1), op, ": x ", x.shape(),
            " must end in in_features and weight must be (out_features, in_features) = (N, ", x.size(-1),
            "), got weight ", weight.shape());
  check_same_dtype(x, weight, op);
  check_same_device(x, weight, op);
  if (!bias.defined()) return;
  CPF_CHECK(bias.shape() == Shape{weight.size(0)}, op, ": bias must have shape [", weight.size(0),
            "] (out_features), got ", bias.shape());
  check_same_dtype(x, bias, op);
  check_same_device(x, bias, op);
}

// The device path of the bias epilogue: f32 and bf16 (cuBLASLt has no f64 bias epilogue).
bool fused_bias_applies(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return bias.defined() && epilogue_dtype_ok(x) && x.numel() > 0 && weight.numel() > 0 &&
         has_kernel(x.device(), &DeviceOps::matmul_bias);
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear(x, weight, bias, "linear");
  const Tensor x2 = flatten_rows(x);           // (M, K)
  const Tensor w_t = transpose(weight, 0, 1);  // (K, N) view
  if (fused_bias_applies(x, weight, bias)) {
    Tensor y = empty({x2.size(0), weight.size(0)}, {.dtype = x.dtype(), .device = x.device()});  // (M, N)
    report_gemm_work(y, x2, w_t, profile::tensor_bytes(bias));
    device_kernel(x.device(), &DeviceOps::matmul_bias, "linear")(y, x2, w_t, epilogue_vector(bias));
    return reshape(y, with_last(x.shape(), weight.size(0)));
  }
  Tensor y = matmul(x2, w_t);  // (M, N)
  if (bias.defined()) y = binary(BinaryOp::add, y, bias);
  return reshape(y, with_last(x.shape(), weight.size(0)));
}

LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear(x, weight, bias, "linear_gelu");
  const int64_t n = weight.size(0);
  const Shape out_shape = with_last(x.shape(), n);
  const Tensor x2 = flatten_rows(x);  // (M, K)
  // cuBLASLt's GELU epilogue keeps the pre-activation in an aux matrix whose leading dim (N) must be a
  // multiple of 8; other shapes run unfused.
  if (epilogue_dtype_ok(x) && x.numel() > 0 && weight.numel() > 0 && n % 8 == 0 &&
      has_kernel(x.device(), &DeviceOps::matmul_epilogue)) {
    const TensorOptions opts{.dtype = x.dtype(), .device = x.device()};
    Tensor out = empty({x2.size(0), n}, opts);  // (M, N)
    Tensor pre = empty({x2.size(0), n}, opts);  // (M, N)
    DeviceGemmArgs args;
    args.epilogue = DeviceGemmEpilogue::gelu;
    args.aux = pre;
    if (bias.defined()) args.bias = epilogue_vector(bias);
    if (device_kernel(x.device(), &DeviceOps::matmul_epilogue, "linear_gelu")(out, x2, transpose(weight, 0, 1), args)) {
      report_gemm_work(out, x2, weight, profile::tensor_bytes(pre) + profile::tensor_bytes(bias));
      return {reshape(out, out_shape), reshape(pre, out_shape)};
    }
  }
  Tensor pre = linear(x, weight, bias);  // (..., N)
  return {unary(UnaryOp::gelu, pre), pre};
}

}  // namespace cpf::raw
