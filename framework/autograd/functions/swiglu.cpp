#include "framework/autograd/functions/swiglu.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/swiglu.h"

namespace cpf {

using autograd::GradList;
using autograd::SavedTensor;

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor y = raw::swiglu(gate, up);  // (..., I)
  // The backward recomputes silu from gate: saving the inputs only, no (..., I) intermediate.
  return autograd::record("swiglu", y, {gate, up},
                          [sg = SavedTensor(gate), su = SavedTensor(up)](const GradList& g) {
                            raw::SwigluGrads grads = raw::swiglu_backward(g[0], sg.unpack(), su.unpack());
                            return GradList{grads.d_gate, grads.d_up};
                          });
}

}  // namespace cpf
