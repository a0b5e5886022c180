#include "framework/autograd/functions/linear.h"

#include "framework/autograd/forward_stash.h"
#include "framework/autograd/fp8_autocast.h"
#include "framework/autograd/functions/elementwise.h"
#include "framework/autograd/functions/fp8_linear.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/linear_common.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using autograd::GradList;
using autograd::SavedTensor;

// The parameters of one linear in x's dtype, validated: the master tensors (gradients go there) and
// the copies the GEMMs read.
struct Resolved {
  Tensor weight, bias;                  // master
  Tensor compute_weight, compute_bias;  // x's dtype
};

Resolved resolve(const Tensor& x, const LinearWeights& p, const char* op) {
  CPF_CHECK(x.defined() && p.weight.defined(), op, ": x and weight must be defined");
  const DType in = x.dtype(), param = p.weight.dtype();
  CPF_CHECK(param == in || (param == DType::f32 && in == DType::bf16), op, ": input dtype ", in,
            " does not match the weight dtype ", param,
            " (mixed precision narrows f32 parameters to bf16 inputs only; convert the input to ", param, ")");
  CPF_CHECK(!p.bias.defined() || p.bias.dtype() == param, op, ": bias dtype ", p.bias.dtype(),
            " must match the weight dtype ", param);
  Resolved r{p.weight, p.bias, p.compute_weight, Tensor()};
  if (p.compute_weight.defined()) {
    CPF_CHECK(p.compute_weight.dtype() == in && p.compute_weight.shape() == p.weight.shape() &&
                  p.compute_weight.device() == p.weight.device(),
              op, ": compute_weight must be the weight ", p.weight.shape(), " in the input dtype ", in, " on ",
              p.weight.device(), ", got ", p.compute_weight.shape(), " ", p.compute_weight.dtype(), " on ",
              p.compute_weight.device());
  } else {
    r.compute_weight = raw::to(p.weight, in);  // p.weight itself when the dtypes agree
  }
  if (p.compute_bias.defined()) {
    CPF_CHECK(p.bias.defined() && p.compute_bias.dtype() == in && p.compute_bias.shape() == p.bias.shape() &&
                  p.compute_bias.device() == p.bias.device(),
              op, ": compute_bias must be the bias ", p.bias.defined() ? p.bias.shape() : Shape{},
              " in the input dtype ", in, ", got ", p.compute_bias.shape(), " ", p.compute_bias.dtype());
    r.compute_bias = p.compute_bias;
  } else if (p.bias.defined()) {
    r.compute_bias = raw::to(p.bias, in);  // p.bias itself when the dtypes agree
  }
  return r;
}

std::vector<Tensor> inputs_of(const Tensor& x, const Resolved& r) { return {x, r.weight, r.bias}; }

// The gradients of a linear's (weight, bias) from the gradient of its output and its input.
void param_grads(const Tensor& grad_y, const Tensor& x, const SavedTensor& w, bool has_bias, GradList& grads) {
  raw::LinearParamGrads pg = raw::linear_param_grads(grad_y, x, w.unpack().dtype(), has_bias);
  grads.push_back(pg.weight);  // (N, K)
  grads.push_back(pg.bias);    // (N) or undefined
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& compute_weight) {
  return linear(x, LinearWeights{weight, bias, compute_weight, Tensor()});
}

Tensor linear(const Tensor& x, const LinearWeights& p) {
  if (p.weight.defined() && use_fp8_linear(x, p.weight.size(0))) {
    return fp8_linear(x, p.weight, p.bias, *next_fp8_linear_options());  // fp8_autocast.h
  }
  const Resolved r = resolve(x, p, "linear");
  // validates shapes; a selectively recomputed region keeps it (forward_stash.h)
  const Tensor y = autograd::stashed("linear", [&] {
                     return std::vector<Tensor>{raw::linear(x, r.compute_weight, r.compute_bias)};
                   }).front();
  return autograd::record(
      "linear", y, inputs_of(x, r),
      [sx = SavedTensor(x), sw = SavedTensor(r.compute_weight), sm = SavedTensor(p.weight),
       has_bias = p.bias.defined()](const GradList& g) {
        const Tensor& xv = sx.unpack();
        GradList grads{raw::reshape(raw::matmul(raw::flatten_rows(g[0]), sw.unpack()), xv.shape())};  // (..., K)
        param_grads(g[0], xv, sm, has_bias, grads);
        return grads;
      });
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& compute_weight) {
  if (weight.defined() && use_fp8_linear(x, weight.size(0)))
    return gelu(fp8_linear(x, weight, bias, *next_fp8_linear_options()));
  const Resolved r = resolve(x, {weight, bias, compute_weight, Tensor()}, "linear_gelu");
  const std::vector<Tensor> kept = autograd::stashed("linear_gelu", [&] {
    raw::LinearGelu v = raw::linear_gelu(x, r.compute_weight, r.compute_bias);  // validates shapes
    return std::vector<Tensor>{v.out, v.pre};
  });
  const raw::LinearGelu y{kept[0], kept[1]};
  return autograd::record(
      "linear_gelu", y.out, inputs_of(x, r),
      [sx = SavedTensor(x), sw = SavedTensor(r.compute_weight), sm = SavedTensor(weight), spre = SavedTensor(y.pre),
       has_bias = bias.defined()](const GradList& g) {
        const Tensor& xv = sx.unpack();
        const Tensor& pre = spre.unpack();
        const Tensor grad_pre = raw::unary_backward(raw::UnaryOp::gelu, raw::contiguous(g[0]), pre, pre);  // (..., N)
        GradList grads{raw::reshape(raw::matmul(raw::flatten_rows(grad_pre), sw.unpack()), xv.shape())};   // (..., K)
        param_grads(grad_pre, xv, sm, has_bias, grads);
        return grads;
      });
}

Tensor gelu_mlp(const Tensor& x, const LinearWeights& in, const LinearWeights& out) {
  if (in.weight.defined() && out.weight.defined() && use_fp8_linear(x, in.weight.size(0)) &&
      out.weight.size(0) % 16 == 0) {
    const Tensor pre = fp8_linear(x, in.weight, in.bias, *next_fp8_linear_options());  // (..., I)
    if (!fp8_fuse_activation_casts()) return fp8_linear(gelu(pre), out.weight, out.bias, *next_fp8_linear_options());
    // GELU's output reaches fc_out only as FP8 codes: one pass over pre writes them (fp8_linear.h).
    return fp8_linear_after(raw::CastActivation::gelu, pre, out.weight, out.bias, *next_fp8_linear_options());
  }
  const Resolved r1 = resolve(x, in, "gelu_mlp (in)");
  const Resolved r2 = resolve(x, out, "gelu_mlp (out)");
  const std::vector<Tensor> kept = autograd::stashed("gelu_mlp", [&] {
    raw::LinearGelu v = raw::linear_gelu(x, r1.compute_weight, r1.compute_bias);                       // (..., I)
    return std::vector<Tensor>{v.out, v.pre, raw::linear(v.out, r2.compute_weight, r2.compute_bias)};  // y (..., C_out)
  });
  const raw::LinearGelu h{kept[0], kept[1]};
  const Tensor& y = kept[2];
  std::vector<Tensor> inputs{x, r1.weight, r1.bias, r2.weight, r2.bias};
  return autograd::record(
      "gelu_mlp", y, inputs,
      [sx = SavedTensor(x), sw1 = SavedTensor(r1.compute_weight), sm1 = SavedTensor(in.weight),
       sw2 = SavedTensor(r2.compute_weight), sm2 = SavedTensor(out.weight), sh = SavedTensor(h.out),
       spre = SavedTensor(h.pre), b1 = in.bias.defined(), b2 = out.bias.defined()](const GradList& g) {
        const Tensor& xv = sx.unpack();
        // dPre = (dY W2) * gelu'(pre) in one GEMM; fc_in's bias gradient comes from its dW GEMM
        // (BGRADB in the master dtype) rather than DGELU_BGRAD (which writes the compute dtype).
        const Tensor grad_pre = raw::linear_dgelu(g[0], sw2.unpack(), spre.unpack(), false).grad_pre;      // (..., I)
        GradList grads{raw::reshape(raw::matmul(raw::flatten_rows(grad_pre), sw1.unpack()), xv.shape())};  // (..., C)
        param_grads(grad_pre, xv, sm1, b1, grads);
        param_grads(g[0], sh.unpack(), sm2, b2, grads);
        return grads;
      });
}

}  // namespace cpf
