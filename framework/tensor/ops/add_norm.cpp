#include "framework/tensor/ops/add_norm.h"

#include <cmath>

#include "framework/tensor/cpu/compute_types.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/norm.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

Shape stat_shape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

Tensor contiguous_or_null(const Tensor& t) { return t.defined() ? contiguous(t) : Tensor(); }

// A dtype that may differ from the stream's: x's own, or bf16 beside an f32 stream (mixed precision).
void check_narrow(DType d, DType x, const char* op, const char* what) {
  CPF_CHECK(d == x || (x == DType::f32 && d == DType::bf16), op, ": ", what, " is ", d, " but x is ", x,
            " (it must be x's dtype, or bf16 with an f32 x)");
}

template <class Fn>
void check_stream(const Tensor& x, const char* op, const char* name, Fn DeviceOps::*entry) {
  check_defined(x, op, name);
  CPF_CHECK(has_kernel(x.device(), entry), op, ": no kernel for device ", x.device(), " in this build");
  CPF_CHECK(is_floating(x.dtype()), op, ": ", name, " must be a floating tensor (f32, f64 or bf16), got ", x.dtype());
  CPF_CHECK(x.dim() >= 1, op, ": ", name, " must have at least one dim (the normalised one), got a scalar");
  CPF_CHECK(x.size(-1) > 0, op, ": the normalised (last) dim of ", name, " is empty, shape ", x.shape());
}

// t (optional) must match x's shape and device; its dtype is checked by the caller.
void check_like(const Tensor& t, const Tensor& x, const char* op, const char* name, const char* x_name) {
  if (!t.defined()) return;
  CPF_CHECK(t.shape() == x.shape(), op, ": ", name, " of shape ", t.shape(), " does not match ", x_name, " of shape ",
            x.shape());
  CPF_CHECK(t.device() == x.device(), op, ": ", name, " is on ", t.device(), " but ", x_name, " is on ", x.device());
}

void check_param(const Tensor& p, const Tensor& x, const char* op, const char* name) {
  if (!p.defined()) return;
  CPF_CHECK(p.shape() == Shape{x.size(-1)}, op, ": ", name, " must have shape [", x.size(-1), "] (the last dim of x ",
            x.shape(), "), got ", p.shape());
  CPF_CHECK(p.dtype() == x.dtype(), op, ": ", name, " is ", p.dtype(), " but x is ", x.dtype(),
            " (the norm's parameters stay in the residual stream's dtype)");
  CPF_CHECK(p.device() == x.device(), op, ": ", name, " is on ", p.device(), " but x is on ", x.device());
}

void check_stat(const Tensor& s, const Tensor& x, const char* op, const char* name) {
  check_defined(s, op, name);
  CPF_CHECK(s.shape() == stat_shape(x), op, ": ", name, " must have shape ", stat_shape(x), " (x1 is ", x.shape(),
            "), got ", s.shape());
  CPF_CHECK(s.dtype() == compute_dtype(x.dtype()), op, ": ", name, " must be ", compute_dtype(x.dtype()), " for a ",
            x.dtype(), " x1, got ", s.dtype());
  CPF_CHECK(s.device() == x.device(), op, ": ", name, " is on ", s.device(), " but x1 is on ", x.device());
}

// The CPU reference: the unfused ops, so the function is the one the unfused model computes.
AddNormResult cpu_forward(NormKind kind, const Tensor& x, const Tensor& branch, const Tensor& weight,
                          const Tensor& bias, double eps, DType out_dtype) {
  const Tensor x1 = branch.defined() ? add(x, to(branch, x.dtype())) : x;  // (..., C)
  if (kind == NormKind::layer_norm) {
    LayerNormResult r = layer_norm(x1, weight, bias, eps);
    return {x1, to(r.y, out_dtype), r.mean, r.rstd};
  }
  RmsNormResult r = rms_norm(x1, weight, eps);
  return {x1, to(r.y, out_dtype), Tensor(), r.rstd};
}

}  // namespace

AddNormResult add_norm(NormKind kind, const Tensor& x, const Tensor& branch, const Tensor& weight, const Tensor& bias,
                       double eps, DType out_dtype) {
  const char* op = kind == NormKind::layer_norm ? "add_layer_norm" : "add_rms_norm";
  check_stream(x, op, "x", &DeviceOps::add_norm);
  if (branch.defined()) {
    check_like(branch, x, op, "branch", "x");
    check_narrow(branch.dtype(), x.dtype(), op, "branch");
  }
  check_narrow(out_dtype, x.dtype(), op, "the output dtype");
  check_param(weight, x, op, "weight");
  check_param(bias, x, op, "bias");
  CPF_CHECK(kind == NormKind::layer_norm || !bias.defined(), op, ": RMSNorm has no bias, got one of shape ",
            bias.defined() ? bias.shape() : Shape{});
  CPF_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
  if (x.device().is_cpu()) return cpu_forward(kind, x, branch, weight, bias, eps, out_dtype);
  const bool centered = kind == NormKind::layer_norm;
  const TensorOptions stat{.dtype = compute_dtype(x.dtype()), .device = x.device()};
  const Tensor xc = contiguous(x);
  AddNormResult r{branch.defined() ? empty(x.shape(), {.dtype = x.dtype(), .device = x.device()}) : x,
                  empty(x.shape(), {.dtype = out_dtype, .device = x.device()}),
                  centered ? empty(stat_shape(x), stat) : Tensor(), empty(stat_shape(x), stat)};
  device_kernel(x.device(), &DeviceOps::add_norm, op)(centered, branch.defined() ? r.x1 : Tensor(), r.y, r.mean, r.rstd,
                                                      xc, contiguous_or_null(branch), contiguous_or_null(weight),
                                                      contiguous_or_null(bias), eps);
  profile::add_work(0, profile::tensor_bytes(x) + profile::tensor_bytes(branch) +
                           (branch.defined() ? profile::tensor_bytes(r.x1) : 0.0) + profile::tensor_bytes(r.y));
  return r;
}

AddNormGrads add_norm_backward(NormKind kind, const Tensor& grad_x1, const Tensor& grad_y, DType y_dtype,
                               const Tensor& x1, const Tensor& weight, bool has_bias, const Tensor& mean,
                               const Tensor& rstd, std::optional<DType> branch_dtype) {
  const char* op = kind == NormKind::layer_norm ? "add_layer_norm_backward" : "add_rms_norm_backward";
  const bool centered = kind == NormKind::layer_norm;
  check_stream(x1, op, "x1", &DeviceOps::add_norm_backward);
  check_narrow(y_dtype, x1.dtype(), op, "the output dtype");
  if (branch_dtype) check_narrow(*branch_dtype, x1.dtype(), op, "the branch dtype");
  check_like(grad_x1, x1, op, "grad_x1", "x1");
  check_like(grad_y, x1, op, "grad_y", "x1");
  CPF_CHECK(!grad_x1.defined() || grad_x1.dtype() == x1.dtype(), op, ": grad_x1 is ", grad_x1.dtype(), " but x1 is ",
            x1.dtype());
  CPF_CHECK(!grad_y.defined() || grad_y.dtype() == y_dtype, op, ": grad_y is ", grad_y.dtype(),
            " but the output y was ", y_dtype);
  check_param(weight, x1, op, "weight");
  CPF_CHECK(centered || !has_bias, op, ": RMSNorm has no bias");
  if (centered) check_stat(mean, x1, op, "mean");
  check_stat(rstd, x1, op, "rstd");
  // A missing output gradient is zero (the engine passes undefined for an unused output).
  const Tensor gy = grad_y.defined() ? grad_y : zeros(x1.shape(), {.dtype = y_dtype, .device = x1.device()});
  if (x1.device().is_cpu()) {
    const Tensor g = to(gy, x1.dtype());
    NormGrads n = centered ? layer_norm_backward(g, x1, weight, mean, rstd) : rms_norm_backward(g, x1, weight, rstd);
    const Tensor dx = grad_x1.defined() ? add(grad_x1, n.dx) : n.dx;  // (..., C)
    return {dx, branch_dtype ? to(dx, *branch_dtype) : Tensor(), n.dweight, has_bias ? n.dbias : Tensor()};
  }
  const TensorOptions opts{.dtype = x1.dtype(), .device = x1.device()};
  const int64_t c = x1.size(-1);
  AddNormGrads d{empty(x1.shape(), opts),
                 branch_dtype ? empty(x1.shape(), {.dtype = *branch_dtype, .device = x1.device()}) : Tensor(),
                 weight.defined() ? empty({c}, opts) : Tensor(), has_bias ? empty({c}, opts) : Tensor()};
  device_kernel(x1.device(), &DeviceOps::add_norm_backward, op)(
      centered, d.dx, d.dbranch, d.dweight, d.dbias, contiguous_or_null(grad_x1), contiguous(gy), contiguous(x1),
      contiguous_or_null(weight), centered ? contiguous(mean) : Tensor(), contiguous(rstd));
  profile::add_work(0, profile::tensor_bytes(grad_x1) + profile::tensor_bytes(gy) + profile::tensor_bytes(x1) +
                           profile::tensor_bytes(d.dx) + profile::tensor_bytes(d.dbranch));
  return d;
}

}  // namespace cpf::raw
