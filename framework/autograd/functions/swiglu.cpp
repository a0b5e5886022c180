#include "framework/autograd/functions/swiglu.h"

#include "framework/autograd/node.h"
#include "framework/core/error.h"
#include "framework/tensor/ops/swiglu.h"
#include "framework/tensor/ops/views.h"

namespace cpf {

using autograd::GradList;
using autograd::SavedTensor;

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor y = raw::swiglu(gate, up);  // (..., I)
  // The backward recomputes silu from gate: saving the inputs only, no (..., I) intermediate.
  return autograd::record("swiglu", y, {gate, up}, [sg = SavedTensor(gate), su = SavedTensor(up)](const GradList& g) {
    raw::SwigluGrads grads = raw::swiglu_backward(g[0], sg.unpack(), su.unpack());
    return GradList{grads.d_gate, grads.d_up};
  });
}

Tensor swiglu_packed(const Tensor& h) {
  CPF_CHECK(h.defined() && h.dim() >= 1 && h.size(-1) % 2 == 0, "swiglu_packed: h must be (..., 2 I) with an even ",
            "last dim (gate | up), got ", h.defined() ? h.shape() : Shape{});
  const int64_t half = h.size(-1) / 2;
  const Tensor gate = raw::narrow(h, -1, 0, half), up = raw::narrow(h, -1, half, half);  // (..., I) views
  Tensor y = raw::swiglu(gate, up);                                                      // (..., I)
  return autograd::record("swiglu_packed", y, {h}, [sh = SavedTensor(h), half](const GradList& g) {
    const Tensor& hv = sh.unpack();
    Tensor dh = empty(hv.shape(), {.dtype = hv.dtype(), .device = hv.device()});  // (..., 2 I)
    raw::swiglu_backward_into(g[0], raw::narrow(hv, -1, 0, half), raw::narrow(hv, -1, half, half),
                              raw::narrow(dh, -1, 0, half), raw::narrow(dh, -1, half, half));
    return GradList{dh};
  });
}

}  // namespace cpf
