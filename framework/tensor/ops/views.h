#pragma once
// Views: new shape/strides/offset over the same storage, no data copied (reshape copies only when
// the strides make a view impossible). Non-differentiable; cpf::reshape etc. in autograd wrap them.
#include "framework/tensor/tensor.h"

namespace cpf::raw {

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);
// One entry may be -1 (inferred). view() throws when the strides do not allow it; reshape() copies.
Tensor view(const Tensor& t, Shape shape);
Tensor reshape(const Tensor& t, Shape shape);
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);
// Elements [start, start + length) along dim.
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
// Python-style slice [start, end) with step > 0; start/end are clamped and may be negative.
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& t, int64_t dim, int64_t index);  // removes dim
// Broadcast to `shape` (stride 0 on the new and size-1 dims); -1 keeps a size.
Tensor expand(const Tensor& t, const Shape& shape);
Tensor squeeze(const Tensor& t, int64_t dim);  // dim must have size 1
Tensor squeeze(const Tensor& t);               // all size-1 dims
Tensor unsqueeze(const Tensor& t, int64_t dim);

// Resolves one -1 in `shape` against numel; throws when the element counts differ.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op);

}  // namespace cpf::raw
