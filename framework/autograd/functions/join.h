#pragma once
// Differentiable joining and splitting along one dim (raw kernels in framework/tensor/ops/join.h).
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf {

// Gradient: the matching slice of the output gradient for each input.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Gradient: output gradient selected at each input's position along the new dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Views of x; the gradient of x gathers each piece's gradient into its slice (zeros for pieces that
// received none). A braced single value, split(x, {4}, 0), picks the chunk_size overload.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t chunk_size, int64_t dim = 0);

}  // namespace cpf
