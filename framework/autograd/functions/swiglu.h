#pragma once
// The differentiable SwiGLU gate: silu(gate) * up in one kernel, its gradient in one (both inputs in one
// pass). Semantics, dtypes and layouts: framework/tensor/ops/swiglu.h.
#include "framework/tensor/tensor.h"

namespace cpf {

// gate, up (..., I) -> (..., I)
Tensor swiglu(const Tensor& gate, const Tensor& up);

// h (..., 2 I) = [gate | up], the output of one fused gate/up projection -> (..., I). The gradient is one
// (..., 2 I) tensor written by the backward kernel in place (no join of two halves).
Tensor swiglu_packed(const Tensor& h);

}  // namespace cpf
