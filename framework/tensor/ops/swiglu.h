#pragma once
// SwiGLU's gate (non-differentiable kernels; cpf::swiglu in framework/autograd/functions/swiglu.h wraps
// them): the Llama feed-forward's silu(gate) * up as one pass over the two projections, and its
// gradient as one pass that writes both input gradients.
//
//   out   = silu(g) * u                         silu(g) = g * s,  s = 1 / (1 + exp(-g))
//   d_g   = dy * u * s * (1 + g * (1 - s))      d_u = dy * silu(g)
//
// Computed in the compute dtype (f32 for f32/bf16, f64 for f64) and rounded once to the storage dtype,
// where the unfused silu then mul rounds silu(g) to bf16 in between.
//
// Layout: gate and up (..., I) of one shape, dtype (f32, f64 or bf16) and device; each needs unit stride
// along I and one stride between rows of I (a contiguous tensor, or a column slice of a wider one such
// as the two halves of a fused gate/up projection); others are made contiguous first. Results are new
// contiguous tensors of that shape and dtype.
#include "framework/tensor/tensor.h"

namespace cpf::raw {

Tensor swiglu(const Tensor& gate, const Tensor& up);

struct SwigluGrads {
  Tensor d_gate;  // (..., I)
  Tensor d_up;    // (..., I)
};

// grad_out: (..., I) of gate's shape, dtype and device (any strides).
SwigluGrads swiglu_backward(const Tensor& grad_out, const Tensor& gate, const Tensor& up);

// The same gradients written into d_gate and d_up: gate's shape, dtype and device, unit stride along I
// and one stride between rows (e.g. the two halves of one (..., 2 I) gradient of a fused projection).
void swiglu_backward_into(const Tensor& grad_out, const Tensor& gate, const Tensor& up, const Tensor& d_gate,
                          const Tensor& d_up);

}  // namespace cpf::raw
