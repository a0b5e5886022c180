#include "framework/autograd/functions/classifier_loss.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

// grad (the saved gradient at an incoming loss gradient of 1, in the compute dtype) * g, returned in
// `dtype`: the product in the compute dtype, rounded once.
Tensor scaled(const Tensor& grad, const Tensor& g, DType dtype) {
  const Tensor factor = raw::to(raw::to(g, grad.device()), grad.dtype());  // one element
  return raw::to(raw::binary(raw::BinaryOp::mul, grad, raw::reshape(factor, Shape{})), dtype);
}

}  // namespace

Tensor classifier_loss(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                       const ClassifierLossOptions& options) {
  ClassifierLossOptions o = options;
  o.compute_grads = autograd::any_requires_grad({hidden, weight});
  raw::ClassifierLossResult r = raw::classifier_loss(hidden, weight, labels, o);
  if (!o.compute_grads) return r.loss;
  // The gradients are plain tensors held by the node: nothing of the forward is saved besides them.
  return autograd::record("classifier_loss", r.loss, {hidden, weight},
                          [dh = r.dhidden, dw = r.dweight, hd = hidden.dtype(), wd = weight.dtype()](
                              const autograd::GradList& g) {
                            return autograd::GradList{scaled(dh, g[0], hd), scaled(dw, g[0], wd)};
                          });
}

}  // namespace cpf
