#pragma once
// The differentiable SwiGLU gate: silu(gate) * up in one kernel, its gradient in one (both inputs in one
// pass). Semantics, dtypes and layouts: framework/tensor/ops/swiglu.h.
#include "framework/tensor/tensor.h"

namespace cpf {

// gate, up (..., I) -> (..., I)
Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace cpf
