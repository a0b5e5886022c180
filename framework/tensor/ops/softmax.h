#pragma once
// Softmax and log-softmax along one dim, and their backward kernels (non-differentiable; cpf::softmax
// in framework/autograd/functions/nn.h wraps them). f32/f64 compute natively, bf16 in f32.
//
// Numerics: every row is shifted by its maximum before exp, so large logits never overflow. A row
// whose elements are all -inf (a fully masked row) gives softmax 0 and log_softmax -inf, never NaN;
// NaN inputs propagate to their whole row.
#include "framework/tensor/tensor.h"

namespace cpf::raw {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// dx = y * (grad_y - sum_dim(grad_y * y)), with y = softmax(x, dim).
Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim);
// dx = grad_y - exp(y) * sum_dim(grad_y), with y = log_softmax(x, dim).
Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim);

}  // namespace cpf::raw
