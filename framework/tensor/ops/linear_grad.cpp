// The backward halves of the linear raw ops (linear.h): linear_dgelu and linear_param_grads.
#include <cstdint>

#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/linear_common.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

// a (..., A) and b (..., B) with one leading shape, dtype and device.
void check_rows(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  check_defined(a, op, an);
  check_defined(b, op, bn);
  CPF_CHECK(a.dim() >= 1 && a.dim() == b.dim() &&
                Shape(a.shape().begin(), a.shape().end() - 1) == Shape(b.shape().begin(), b.shape().end() - 1),
            op, ": ", an, " ", a.shape(), " and ", bn, " ", b.shape(), " must share their leading dims");
  check_same_dtype(a, b, op);
  check_same_device(a, b, op);
}

}  // namespace

LinearDgelu linear_dgelu(const Tensor& grad_y, const Tensor& weight, const Tensor& pre, bool bias_grad) {
  check_rows(grad_y, pre, "linear_dgelu", "grad_y", "pre");
  check_defined(weight, "linear_dgelu", "weight");
  CPF_CHECK(weight.dim() == 2 && weight.size(0) == grad_y.size(-1) && weight.size(1) == pre.size(-1),
            "linear_dgelu: weight must be (N, K) = (", grad_y.size(-1), ", ", pre.size(-1), ") for grad_y ",
            grad_y.shape(), " and pre ", pre.shape(), ", got ", weight.shape());
  check_same_dtype(grad_y, weight, "linear_dgelu");
  check_same_device(grad_y, weight, "linear_dgelu");
  const int64_t k = pre.size(-1);
  const Tensor g2 = flatten_rows(grad_y);  // (M, N)
  const Tensor p2 = flatten_rows(pre);     // (M, K)
  if (epilogue_dtype_ok(pre) && pre.numel() > 0 && g2.size(1) > 0 && k % 8 == 0 &&
      has_kernel(pre.device(), &DeviceOps::matmul_epilogue)) {
    const TensorOptions opts{.dtype = pre.dtype(), .device = pre.device()};
    Tensor grad_pre = empty({p2.size(0), k}, opts);  // (M, K)
    DeviceGemmArgs args;
    args.epilogue = DeviceGemmEpilogue::dgelu;
    args.aux = p2;
    if (bias_grad) args.bias_grad = empty({k}, opts);
    if (device_kernel(pre.device(), &DeviceOps::matmul_epilogue, "linear_dgelu")(grad_pre, g2, weight, args)) {
      report_gemm_work(grad_pre, g2, weight, profile::tensor_bytes(p2) + profile::tensor_bytes(args.bias_grad));
      return {reshape(grad_pre, pre.shape()), args.bias_grad};
    }
  }
  const Tensor grad_h = matmul(g2, weight);                         // (M, K)
  Tensor grad_pre = unary_backward(UnaryOp::gelu, grad_h, p2, p2);  // (M, K)
  LinearDgelu r{reshape(grad_pre, pre.shape()), Tensor()};
  if (bias_grad) r.bias_grad = sum(grad_pre, {0});  // (K)
  return r;
}

LinearParamGrads linear_param_grads(const Tensor& grad_y, const Tensor& x, DType dtype, bool bias,
                                    const Tensor& accumulate_into) {
  check_rows(grad_y, x, "linear_param_grads", "grad_y", "x");
  CPF_CHECK(dtype == x.dtype() || (dtype == DType::f32 && x.dtype() == DType::bf16),
            "linear_param_grads: gradient dtype ", dtype, " for ", x.dtype(),
            " operands is not supported (use the operands' dtype, or f32 for bf16 operands)");
  const int64_t n = grad_y.size(-1), k = x.size(-1);
  if (accumulate_into.defined()) {
    CPF_CHECK(accumulate_into.shape() == Shape({n, k}) && accumulate_into.dtype() == dtype &&
                  accumulate_into.is_contiguous() && accumulate_into.device() == x.device(),
              "linear_param_grads: accumulate_into must be a contiguous (", n, ", ", k, ") ", dtype, " tensor on ",
              x.device(), ", got ", accumulate_into.shape(), " ", accumulate_into.dtype(), " on ",
              accumulate_into.device());
  }
  const Tensor g2 = flatten_rows(grad_y);  // (M, N)
  const Tensor x2 = flatten_rows(x);       // (M, K)
  const Tensor g_t = transpose(g2, 0, 1);  // (N, M) view
  if (epilogue_dtype_ok(x) && g2.size(0) > 0 && n > 0 && k > 0 && has_kernel(x.device(), &DeviceOps::matmul_epilogue)) {
    const TensorOptions opts{.dtype = dtype, .device = x.device()};
    Tensor w = accumulate_into.defined() ? accumulate_into : empty({n, k}, opts);  // (N, K)
    // The bias gradient rides in the same GEMM (BGRADB: the row sums of g_t).
    DeviceGemmArgs args;
    args.accumulate = accumulate_into.defined();
    if (bias) args.bias_grad = empty({n}, opts);
    if (device_kernel(x.device(), &DeviceOps::matmul_epilogue, "linear_param_grads")(w, g_t, x2, args)) {
      // Accumulating reads the gradient it adds to as well.
      report_gemm_work(w, g_t, x2,
                       (args.accumulate ? profile::tensor_bytes(w) : 0.0) + profile::tensor_bytes(args.bias_grad));
      return {w, args.bias_grad};
    }
  }
  // Unfused: the same function, the operands widened first so the products and sums are dtype's.
  const Tensor gc = to(g2, dtype), xc = to(x2, dtype);
  Tensor w = matmul(transpose(gc, 0, 1), xc);  // (N, K)
  if (accumulate_into.defined()) {
    add_(accumulate_into, w);
    w = accumulate_into;
  }
  return {w, bias ? sum(gc, {0}) : Tensor()};
}

}  // namespace cpf::raw
