#include "framework/autograd/functions/fp8_linear.h"

#include "framework/autograd/fp8_weight_cache.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/ops/fp8_activation.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/linear_common.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using autograd::GradList;
using autograd::SavedTensor;

constexpr const char* kOp = "fp8_linear";

// One tensor in FP8 with its current scale: the data (and, when asked, its transpose) and the inverse
// scale the GEMM multiplies back.
struct Scaled {
  Tensor data;         // (R, C) fp8
  Tensor transpose;    // (C, R) fp8, or undefined
  Tensor scale_inv;    // () f32
  Tensor column_sums;  // (C) f32: t summed over its rows, when asked for
};

using Activation = std::optional<raw::CastActivation>;

// t in FP8: with the slot's scale of `role` (delayed scaling, a settled slot) or a scale from t's own amax
// (current scaling, or a fresh slot); a slot records t's amax in the same pass. With an activation, t is
// that activation's input and what is cast is its output (fp8_activation.h: no bf16 copy of it). With
// column_sums (transposed, no activation), t's sums over its rows come from the same pass.
Scaled cast(const Tensor& t, DType fp8, const Fp8LinearOptions& o, Fp8Role role, bool plain, bool transposed,
            Activation activation = std::nullopt, bool column_sums = false) {
  CPF_CHECK(!activation || transposed, kOp, ": an activation's output is cast with its transpose only");
  CPF_CHECK(!column_sums || (transposed && !activation), kOp, ": column sums come with a plain transposing cast");
  const auto r = static_cast<size_t>(role);
  const bool delayed = o.slot && !o.slot->fresh;
  Tensor h;  // the activation's output, when the device had no fused kernel for its shape and computed it
  const Tensor scale =
      delayed
          ? o.slot->scale[r]
          : raw::fp8_scale(activation ? raw::activation_abs_max(t, *activation, &h) : raw::abs_max(t), fp8, o.margin);
  if (h.defined()) activation.reset();  // cast h as it is rather than computing it again
  // A fresh slot keeps the scale it cast with: should this step's amax never reach its history (a skipped
  // step, an evaluation, an all-zero tensor), its next cast uses that rather than a guess.
  if (o.slot && !delayed) raw::copy_(o.slot->scale[r], scale);
  const Tensor amax_out = o.slot ? o.slot->amax[r] : Tensor();
  Scaled s;
  s.scale_inv = raw::unary(raw::UnaryOp::reciprocal, scale);
  if (transposed) {
    raw::Fp8Transposed both =
        activation  // one pass
            ? raw::quantize_activation_fp8_transposed(t, *activation, scale, fp8, amax_out, plain)
            : raw::quantize_fp8_transposed(h.defined() ? h : t, scale, fp8, amax_out, plain, column_sums);
    s.data = both.q;
    s.transpose = both.qt;
    s.column_sums = both.column_sums;
  } else if (plain) {
    s.data = raw::quantize_fp8(t, scale, fp8, amax_out);
  }
  return s;
}

// x's width: K, or 2 K for SwiGLU's [gate | up].
int64_t in_features(const Tensor& x, Activation activation) {
  const int64_t width = x.dim() >= 1 ? x.size(-1) : 0;
  return activation == raw::CastActivation::swiglu ? width / 2 : width;
}

void check_inputs(const Tensor& x, const std::vector<Tensor>& weights, const Tensor& bias, Activation activation) {
  CPF_CHECK(x.defined() && !weights.empty(), kOp, ": x and weight must be defined");
  const Tensor& weight = weights[0];
  int64_t rows = 0;
  for (const Tensor& w : weights) {
    CPF_CHECK(w.defined(), kOp, ": x and weight must be defined");
    CPF_CHECK(weights.size() == 1 || (w.dim() == 2 && weight.dim() == 2 && w.size(1) == weight.size(1) &&
                                      w.dtype() == weight.dtype() && w.device() == weight.device()),
              kOp, ": the weight's parts must be 2-D of one width, dtype and device, got ", w.shape(), " ",
              dtype_name(w.dtype()), " on ", w.device(), " beside ", weight.shape(), " ", dtype_name(weight.dtype()),
              " on ", weight.device());
    rows += w.dim() >= 1 ? w.size(0) : 0;
  }
  CPF_CHECK(x.dtype() == DType::bf16, kOp, ": x must be bf16 (FP8 training computes around the GEMMs in bf16), got ",
            dtype_name(x.dtype()));
  CPF_CHECK(weight.dtype() == DType::f32 || weight.dtype() == DType::bf16, kOp, ": weight must be f32 or bf16, got ",
            dtype_name(weight.dtype()));
  const bool swiglu = activation == raw::CastActivation::swiglu;
  CPF_CHECK(weight.dim() == 2 && x.dim() >= 1 && (!swiglu || x.size(-1) % 2 == 0) &&
                in_features(x, activation) == weight.size(1),
            kOp, ": ", activation ? "pre " : "x ", x.shape(), " does not match weight ",
            weights.size() == 1 ? weight.shape() : Shape{rows, weight.size(1)},
            swiglu ? " (pre (..., 2 K) = [gate | up] with weight (N, K))" : " (x (..., K) with weight (N, K))");
  CPF_CHECK(x.device() == weight.device(), kOp, ": x is on ", x.device(), " but weight on ", weight.device());
  if (bias.defined()) {
    CPF_CHECK(
        bias.dim() == 1 && bias.size(0) == rows && bias.dtype() == weight.dtype() && bias.device() == weight.device(),
        kOp, ": bias must be a (", rows, ") ", dtype_name(weight.dtype()), " tensor on ", weight.device(), ", got ",
        bias.shape(), " ", dtype_name(bias.dtype()), " on ", bias.device());
  }
}

// The weight in E4M3 with its transpose: the step's kept copy (fp8_weight_cache.h), or cast from the
// parts' concatenation (and kept when a step is open).
Scaled weight_in_fp8(const std::vector<Tensor>& weights, const Fp8LinearOptions& o) {
  if (o.weight_cache != nullptr) {
    Fp8WeightCopy kept = o.weight_cache->find(weights, o);
    if (kept.data.defined()) return {kept.data, kept.transpose, kept.scale_inv, Tensor()};
  }
  const Tensor w = weights.size() == 1 ? weights[0] : raw::cat(weights, 0);  // (N, K)
  Scaled s = cast(w, DType::f8e4m3, o, Fp8Role::weight, true, true);
  if (o.weight_cache != nullptr) o.weight_cache->store(weights, o, {s.data, s.transpose, s.scale_inv});
  return s;
}

}  // namespace

namespace {

// The op for both entry points: y = act(x) W^T + b, act the identity when activation is nullopt.
Tensor fp8_linear_impl(const Tensor& x, Activation activation, const std::vector<Tensor>& weights, const Tensor& bias,
                       const Fp8LinearOptions& options) {
  check_inputs(x, weights, bias, activation);
  const Tensor x2 = raw::contiguous(raw::flatten_rows(x));  // (M, K), or SwiGLU's (M, 2 K)
  const Scaled xs = cast(x2, DType::f8e4m3, options, Fp8Role::input, true, true, activation);
  const Scaled ws = weight_in_fp8(weights, options);
  const Tensor bias16 = bias.defined() ? raw::to(bias, DType::bf16) : Tensor();
  const Tensor y2 = raw::fp8_matmul_nt(xs.data, xs.scale_inv, ws.data, ws.scale_inv, DType::bf16, bias16,
                                       options.fast_forward_accumulation);  // (M, N)
  Shape out_shape = x.shape();
  out_shape.back() = y2.size(1);
  const Tensor y = raw::reshape(y2, out_shape);
  std::vector<Tensor> inputs{x};
  std::vector<int64_t> part_rows;
  for (const Tensor& w : weights) {
    inputs.push_back(w);
    part_rows.push_back(w.size(0));
  }
  inputs.push_back(bias);
  return autograd::record(
      activation ? (*activation == raw::CastActivation::gelu ? "fp8_linear_after_gelu" : "fp8_linear_after_swiglu")
                 : kOp,
      y, inputs,
      [x_shape = x.shape(), xt = SavedTensor(xs.transpose), x_inv = SavedTensor(xs.scale_inv),
       pre = SavedTensor(activation ? x2 : Tensor()), activation, wt = SavedTensor(ws.transpose),
       w_inv = SavedTensor(ws.scale_inv), w_dtype = weights[0].dtype(), part_rows, has_bias = bias.defined(),
       options](const GradList& g) {
        const Tensor g2 = raw::contiguous(raw::to(raw::flatten_rows(g[0]), DType::bf16));  // (M, N)
        // The bias gradient (dY's column sums) comes from the cast's read of dY (fp8.h).
        const Scaled gs = cast(g2, DType::f8e5m2, options, Fp8Role::grad_output, true, true, std::nullopt, has_bias);
        // dX (M, K) = dY (M, N) W (N, K): the K-major operands are dY and W^T (K, N).
        const Tensor dx = raw::fp8_matmul_nt(gs.data, gs.scale_inv, wt.unpack(), w_inv.unpack(), DType::bf16);
        // dW (N, K) = dY^T (N, M) X (M, K): the K-major operands are dY^T and X^T (K, M).
        const DType w_out = w_dtype == DType::f32 ? DType::f32 : DType::bf16;
        const Tensor dw = raw::fp8_matmul_nt(gs.transpose, gs.scale_inv, xt.unpack(), x_inv.unpack(), w_out);
        // Through the activation: d_pre from dH and the kept pre.
        const Tensor dx_in = activation ? raw::cast_activation_backward(dx, pre.unpack(), *activation) : dx;
        GradList grads{raw::reshape(dx_in, x_shape)};
        int64_t row = 0;
        for (int64_t rows : part_rows) {  // each part's rows of dW
          grads.push_back(part_rows.size() == 1 ? dw : raw::contiguous(raw::narrow(dw, 0, row, rows)));
          row += rows;
        }
        grads.push_back(has_bias ? raw::to(gs.column_sums, w_dtype) : Tensor());
        return grads;
      });
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Fp8LinearOptions& options) {
  return fp8_linear_impl(x, std::nullopt, std::vector<Tensor>{weight}, bias, options);
}

Tensor fp8_linear(const Tensor& x, const std::vector<Tensor>& weights, const Tensor& bias,
                  const Fp8LinearOptions& options) {
  return fp8_linear_impl(x, std::nullopt, weights, bias, options);
}

Tensor fp8_linear_after(raw::CastActivation activation, const Tensor& pre, const Tensor& weight, const Tensor& bias,
                        const Fp8LinearOptions& options) {
  return fp8_linear_impl(pre, activation, std::vector<Tensor>{weight}, bias, options);
}

}  // namespace cpf
