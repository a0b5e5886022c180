#pragma once
// Joining and splitting along one dim (non-differentiable; cpf::cat/split/stack in autograd wrap them).
// Inputs to cat/stack must share dtype and device; cat needs equal shapes outside `dim` (a size of 0
// along `dim` is fine), stack needs equal shapes. split returns views that share x's storage.
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::raw {

// A new tensor holding the inputs one after another along dim. (n_0, ...) + (n_1, ...) -> (n_0 + n_1, ...)
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Inserts a new dim of size tensors.size() at `dim` (in [-(rank+1), rank]) and joins along it.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

// Views of consecutive pieces of the given sizes along dim; the sizes must add up to x.size(dim).
// Note that a braced single value, split(x, {4}, 0), picks the chunk_size overload below.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// Views of chunk_size elements along dim each; the last one holds the remainder. A dim of size 0
// gives one empty piece.
std::vector<Tensor> split(const Tensor& x, int64_t chunk_size, int64_t dim = 0);

}  // namespace cpf::raw
