#include "framework/autograd/functions/classifier_loss.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

constexpr const char* kOp = "classifier_loss";

// grad (the saved gradient at an incoming loss gradient of 1, in the compute dtype) * g, returned in
// `dtype`: the product in the compute dtype, rounded once.
Tensor scaled(const Tensor& grad, const Tensor& g, DType dtype) {
  const Tensor factor = raw::to(raw::to(g, grad.device()), grad.dtype());  // one element
  return raw::to(raw::binary(raw::BinaryOp::mul, grad, raw::reshape(factor, Shape{})), dtype);
}

// The weight the GEMMs read: head.compute_weight when given (validated), else the master in hidden's dtype.
Tensor compute_weight_of(const Tensor& hidden, const LinearWeights& head) {
  CPF_CHECK(hidden.defined() && head.weight.defined(), kOp, ": hidden and the head weight must be defined");
  CPF_CHECK(!head.bias.defined() && !head.compute_bias.defined(), kOp, ": the head takes no bias (got one of shape ",
            head.bias.defined() ? head.bias.shape() : head.compute_bias.shape(),
            "); drop it or use linear + cross_entropy");
  const DType in = hidden.dtype(), param = head.weight.dtype();
  CPF_CHECK(param == in || (param == DType::f32 && in == DType::bf16), kOp, ": hidden dtype ", in,
            " does not match the head weight dtype ", param,
            " (mixed precision narrows f32 weights to bf16 hidden only; convert hidden to ", param, ")");
  if (!head.compute_weight.defined()) return raw::to(head.weight, in);  // the master itself when dtypes agree
  CPF_CHECK(head.compute_weight.dtype() == in && head.compute_weight.shape() == head.weight.shape() &&
                head.compute_weight.device() == head.weight.device(),
            kOp, ": compute_weight must be the head weight ", head.weight.shape(), " in hidden's dtype ", in, " on ",
            head.weight.device(), ", got ", head.compute_weight.shape(), " ", head.compute_weight.dtype(), " on ",
            head.compute_weight.device());
  return head.compute_weight;
}

}  // namespace

Tensor classifier_loss(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                       const ClassifierLossOptions& options) {
  CPF_CHECK(!hidden.defined() || !weight.defined() || hidden.dtype() == weight.dtype(), kOp, ": hidden dtype ",
            hidden.dtype(), " differs from weight dtype ", weight.dtype(),
            " (pass the head as LinearWeights for f32 weights beside bf16 hidden)");
  return classifier_loss(hidden, LinearWeights{weight, Tensor(), Tensor(), Tensor()}, labels, options);
}

Tensor classifier_loss(const Tensor& hidden, const LinearWeights& head, const Tensor& labels,
                       const ClassifierLossOptions& options) {
  const Tensor weight = compute_weight_of(hidden, head);  // (V, C) in hidden's dtype
  ClassifierLossOptions o = options;
  o.compute_grads = autograd::any_requires_grad({hidden, head.weight});
  raw::ClassifierLossResult r = raw::classifier_loss(hidden, weight, labels, o);
  if (!o.compute_grads) return r.loss;
  // The gradients are plain tensors held by the node: nothing of the forward is saved besides them.
  // dweight is in the compute dtype (f32 for bf16): the f32 master's gradient with no rounding.
  return autograd::record(
      "classifier_loss", r.loss, {hidden, head.weight},
      [dh = r.dhidden, dw = r.dweight, hd = hidden.dtype(), wd = head.weight.dtype()](const autograd::GradList& g) {
        return autograd::GradList{scaled(dh, g[0], hd), scaled(dw, g[0], wd)};
      });
}

}  // namespace cpf
