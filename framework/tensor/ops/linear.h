#pragma once
// The affine map of a linear layer and its GEMM-fused neighbours, as raw ops. On a device each is one
// cuBLASLt GEMM whose epilogue does the element-wise part (bias, GELU, GELU's derivative, the bias
// gradient), so the (tokens, features) result is written once instead of being re-read by a separate
// kernel; the CPU computes the same functions unfused (matmul, add, gelu, sum), and a device problem
// cuBLASLt has no epilogue kernel for (N % 8 != 0 with GELU, say) runs unfused there too.
//
// The leading dims of x are flattened into one 2-D GEMM; a weight (N, K) is read through its
// transposed view (no copy). GELU is the tanh approximation (raw::UnaryOp::gelu, GPT-2's).
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// x (..., K), weight (N, K), bias (N) or undefined -> (..., N): x @ weight^T + bias.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// out = gelu(pre), pre = x @ weight^T + bias (kept for the backward); both (..., N) of x's dtype.
struct LinearGelu {
  Tensor out;
  Tensor pre;
};
LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);

// The backward through h = gelu(pre) of a linear y = h @ weight^T + b that reads h: grad_y (..., N),
// weight (N, K), pre (..., K). grad_pre = (grad_y @ weight) * gelu'(pre), (..., K); with bias_grad,
// also its sums over the leading dims (K): the gradient of the bias that produced pre.
struct LinearDgelu {
  Tensor grad_pre;
  Tensor bias_grad;  // undefined unless asked for
};
LinearDgelu linear_dgelu(const Tensor& grad_y, const Tensor& weight, const Tensor& pre, bool bias_grad);

// The parameter gradients of y = x @ weight^T + bias from grad_y (..., N) and x (..., K) of one dtype:
// weight (N, K) = grad_y^T @ x and, with `bias`, bias (N) = the sums of grad_y over its leading dims,
// both in `dtype`: x's dtype, or f32 for bf16 x, in which case the f32 accumulation is written
// without a bf16 rounding step (the gradient of an f32 master weight). `accumulate_into`, when
// defined, is an (N, K) contiguous tensor of `dtype` that receives weight += grad_y^T @ x in place
// and is returned as the weight gradient.
struct LinearParamGrads {
  Tensor weight;
  Tensor bias;  // undefined unless asked for
};
LinearParamGrads linear_param_grads(const Tensor& grad_y, const Tensor& x, DType dtype, bool bias,
                                    const Tensor& accumulate_into = Tensor());

}  // namespace cpf::raw
