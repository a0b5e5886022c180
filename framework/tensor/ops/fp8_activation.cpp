#include "framework/tensor/ops/fp8_activation.h"

#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/swiglu.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

// The DeviceOps code of an activation (device_ops.h; the CUDA kernels' kFp8Gelu / kFp8Swiglu).
int device_code(CastActivation activation) { return activation == CastActivation::gelu ? 1 : 2; }

// h's width: C.
int64_t output_cols(const Tensor& pre, CastActivation activation) {
  return activation == CastActivation::swiglu ? pre.size(1) / 2 : pre.size(1);
}

void check_pre(const Tensor& pre, CastActivation activation, const char* op) {
  check_defined(pre, op, "pre");
  CPF_CHECK(pre.dtype() == DType::bf16, op, ": pre must be bf16 (FP8 training computes its activations in bf16), got ",
            dtype_name(pre.dtype()));
  CPF_CHECK(pre.dim() == 2, op, ": pre must be 2-D (rows, features), got ", pre.shape());
  CPF_CHECK(activation != CastActivation::swiglu || pre.size(1) % 2 == 0, op,
            ": swiglu's pre (R, 2 C) = [gate | up] needs an even width, got ", pre.shape());
}

// The device's fused kernel when it has one for this shape (it returns false otherwise).
template <class Entry, class... Args>
bool run_fused(const Tensor& pre, Entry DeviceOps::*entry, Args&&... args) {
  if (pre.device().is_cpu()) return false;
  const DeviceOps* ops = find_device_ops(pre.device().type);
  return ops != nullptr && ops->*entry != nullptr && (ops->*entry)(std::forward<Args>(args)...);
}

}  // namespace

const char* cast_activation_name(CastActivation activation) {
  return activation == CastActivation::gelu ? "gelu" : "swiglu";
}

Tensor apply_cast_activation(const Tensor& pre, CastActivation activation) {
  check_pre(pre, activation, "apply_cast_activation");
  if (activation == CastActivation::gelu) return unary(UnaryOp::gelu, pre);
  const int64_t c = output_cols(pre, activation);
  return swiglu(narrow(pre, 1, 0, c), narrow(pre, 1, c, c));  // (R, C)
}

Tensor cast_activation_backward(const Tensor& grad_h, const Tensor& pre, CastActivation activation) {
  check_pre(pre, activation, "cast_activation_backward");
  const int64_t c = output_cols(pre, activation);
  CPF_CHECK(grad_h.defined() && grad_h.shape() == Shape({pre.size(0), c}) && grad_h.dtype() == pre.dtype(),
            "cast_activation_backward: grad_h must be (", pre.size(0), ", ", c, ") ", dtype_name(pre.dtype()), " for ",
            cast_activation_name(activation), "'s pre ", pre.shape(), ", got ",
            grad_h.defined() ? grad_h.shape() : Shape{}, " ",
            grad_h.defined() ? dtype_name(grad_h.dtype()) : "undefined");
  if (activation == CastActivation::gelu) return unary_backward(UnaryOp::gelu, contiguous(grad_h), pre, pre);
  Tensor grad_pre = empty(pre.shape(), {.dtype = pre.dtype(), .device = pre.device()});  // (R, 2 C)
  swiglu_backward_into(grad_h, narrow(pre, 1, 0, c), narrow(pre, 1, c, c), narrow(grad_pre, 1, 0, c),
                       narrow(grad_pre, 1, c, c));
  return grad_pre;
}

Tensor activation_abs_max(const Tensor& pre, CastActivation activation, Tensor* computed) {
  check_pre(pre, activation, "activation_abs_max");
  const Tensor pc = contiguous(pre);
  Tensor out = zeros({}, {.dtype = DType::f32, .device = pre.device()});
  if (pre.numel() == 0) return out;
  if (run_fused(pc, &DeviceOps::fp8_activation_amax, out, pc, device_code(activation))) return out;
  const Tensor h = apply_cast_activation(pc, activation);  // (R, C)
  if (computed != nullptr) *computed = h;
  return abs_max(h);
}

Fp8Transposed quantize_activation_fp8_transposed(const Tensor& pre, CastActivation activation, const Tensor& scale,
                                                 DType fp8, const Tensor& amax_out, bool with_plain) {
  check_pre(pre, activation, "quantize_activation_fp8_transposed");
  const Tensor pc = contiguous(pre);
  const int64_t rows = pc.size(0), cols = output_cols(pc, activation);
  if (rows > 0 && cols > 0 && is_fp8(fp8)) {
    Fp8Transposed out;
    out.qt = empty({cols, rows}, {.dtype = fp8, .device = pc.device()});
    if (with_plain) out.q = empty({rows, cols}, {.dtype = fp8, .device = pc.device()});
    const auto scalar_here = [&](const Tensor& t) {
      return t.device() == pc.device() && t.dtype() == DType::f32 && t.numel() == 1 && t.dim() <= 1;
    };
    // Anything else is refused by the unfused path below, with quantize_fp8_transposed's messages.
    if (scale.defined() && scalar_here(scale) && (!amax_out.defined() || scalar_here(amax_out)) &&
        run_fused(pc, &DeviceOps::quantize_fp8_activation, out.q, out.qt, pc, device_code(activation), scale,
                  amax_out)) {
      return out;
    }
  }
  // The unfused path, which also validates scale, fp8 and amax_out with quantize_fp8_transposed's messages.
  return quantize_fp8_transposed(apply_cast_activation(pc, activation), scale, fp8, amax_out, with_plain);
}

}  // namespace cpf::raw
