#pragma once
// Differentiable indexing (raw kernels in framework/tensor/ops/index.h and raw::where). Index and
// mask tensors are never differentiated; repeated indices accumulate their gradients.
#include "framework/tensor/tensor.h"

namespace cpf {

// Gradient of x: the output gradient index_add-ed back into x's shape.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// numpy take_along_axis; gradient of x: the output gradient scatter-added back.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// x + src scattered along dim by index; gradients: x gets the output gradient, src gathers it.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// cond ? a : b with broadcasting; each side gets the gradient where it was chosen, summed back to its shape.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with value where mask is true; the gradient of x is zero there.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

}  // namespace cpf
