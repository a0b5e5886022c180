#pragma once
// Differentiable linear layers: one op per GEMM group, so the GEMMs' cuBLASLt epilogues can do the
// element-wise work around them on a device (framework/tensor/ops/linear.h).
//
// Mixed precision inside the op: the weight and bias are the tensors that receive gradients (f32
// master parameters, say) and may be f32 while x is bf16. The op then multiplies with bf16 copies
// (cast here, or `compute_weight`, a bf16 copy the caller already holds, e.g. a per-step cache) and
// its backward writes the f32 weight and bias gradients straight from the dW GEMM (bf16 operands, f32
// accumulation and output): no bf16 gradient is rounded and then widened by a cast. Any other dtype
// pair is an error.
#include "framework/tensor/tensor.h"

namespace cpf {

// One linear's parameters as the ops take them (see linear for compute_weight).
struct LinearWeights {
  Tensor weight;          // (out, in)
  Tensor bias;            // (out) or undefined
  Tensor compute_weight;  // undefined, or weight in x's dtype
  Tensor compute_bias;    // undefined, or bias in x's dtype (else the op casts it)
};

// linear(x, p.weight, p.bias, p.compute_weight), also reading p.compute_bias.
Tensor linear(const Tensor& x, const LinearWeights& p);

// x (..., K) @ weight^T + bias: weight (N, K), bias (N) or undefined -> (..., N), x's dtype. One 2-D
// GEMM per pass over the flattened leading dims: dX = dY W, dW = dY^T X with the bias gradient (the
// column sums of dY) in the same GEMM's epilogue on a device; the forward bias is an epilogue too.
// compute_weight: undefined, or weight's values in x's dtype (not differentiated: the gradient goes
// to weight).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              const Tensor& compute_weight = Tensor());

// gelu(linear(x, weight, bias)) with the GELU (tanh approximation) in the forward GEMM's epilogue.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                   const Tensor& compute_weight = Tensor());

// The GELU feed-forward block as one op: linear(linear_gelu(x, in), out), x (..., C) -> (..., C_out).
// Backward on a device: the dH GEMM of the output projection applies GELU's derivative in its
// epilogue (cuBLASLt DGELU, reading the pre-activation the forward kept), and each dW GEMM writes its
// bias gradient in its epilogue (BGRADB), so no element-wise GELU or bias-fold kernel runs.
Tensor gelu_mlp(const Tensor& x, const LinearWeights& in, const LinearWeights& out);

}  // namespace cpf
