#pragma once
// Indexing by integer tensors (non-differentiable kernels; cpf::index_select etc. in autograd wrap them).
//
// Index tensors are i32 or i64, any strides. Indices must lie in [0, size) of the indexed dim
// (negative indices are rejected, not wrapped); an out-of-range index throws naming its value, its
// position in the index tensor and the size, and nothing is written. All inputs must be on one device.
//
// Accumulating ops (index_add_, scatter_add, scatter_add_) are deterministic: every destination
// element receives its contributions in increasing index-position order, whatever the thread count.
// They support f32, f64, bf16 (accumulated in f32 and rounded once at the end), i32 and i64.
// (raw::where lives in elementwise.h.)
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// out.select(dim, i) = x.select(dim, index[i]); index is 1-D. x (..., n, ...) -> (..., m, ...), m = index.numel().
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// dst.select(dim, index[i]) += src.select(dim, i) for every i, in place; src has dst's shape except
// src.size(dim) == index.numel(). Bumps dst's version. (The gradient of index_select.)
void index_add_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src);

// dst.select(dim, index[i]) = src.select(dim, i) for every i, in place, in index-position order (a
// repeated index keeps the last row, on every device); src has dst's shape except src.size(dim) ==
// index.numel() and dst's dtype. Bumps dst's version. (Writing a KV cache's rows at positions held on the
// device, e.g. inside a CUDA graph.)
void index_copy_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src);
// numpy take_along_axis: out[p] = x[p with p[dim] replaced by index[p]]. index has x's rank and x's
// sizes outside dim (no broadcasting: expand the index first); out has index's shape.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// In place: dst[p with p[dim] replaced by index[p]] += src[p] for every p of index's shape. src has
// index's shape; index has dst's sizes outside dim. dst must not overlap itself (no expanded
// views). Bumps dst's version. (The gradient of gather.)
void scatter_add_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src);
// Out of place: a copy of x with src scattered and added into it.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

// x with `value` wherever the bool mask (broadcastable to x's shape) is true. value must be
// representable in x's dtype (integral for integer tensors, 0 or 1 for bool).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

}  // namespace cpf::raw
