#pragma once
// Reductions over a set of dims (empty = all dims), with keepdim. f32/f64 (bf16 via f32).
#include "framework/tensor/tensor.h"

namespace cpf::raw {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// NaN propagates. Reducing over a dim of size 0 is an error (there is no maximum).
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Index of the first maximum along one dim, as i64.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
// log(sum(exp(x))) computed stably (max-shifted); rows of all -inf give -inf.
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Sums a broadcast result back down to `shape` (the gradient of an expand).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace cpf::raw
