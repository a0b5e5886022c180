#pragma once
// FP8 casts fused into the activation that makes the tensor (#32, docs/fp8.md "Fused casts"): the input of
// an MLP's output projection is h = activation(pre), and an FP8 linear needs h only as its E4M3 codes. These
// ops read pre and write the codes (and their transpose) in one pass, so h is never written in bf16 nor read
// back for its amax and its cast:
//
//   unfused   h = act(pre) (bf16)  ->  amax(h)  ->  quantize_fp8_transposed(h)     write h, read it twice
//   fused     activation_abs_max(pre)  ->  quantize_activation_fp8_transposed(pre) read pre twice (current
//                                                                                   scaling), once (delayed)
//
// The values are those of the unfused path: h is rounded to bf16 before it is scaled, as the element-wise
// activation kernels round it (on CUDA both use one definition of each activation; on the CPU the fused
// ops are the composition itself). Shapes: gelu pre (R, C) -> h (R, C); swiglu pre (R, 2 C) = [gate | up]
// (a fused gate/up projection's output) -> h = silu(gate) * up (R, C). pre is bf16. Backends without a
// fused kernel for a shape (the CPU; CUDA unless R and C are multiples of 64) compute h and cast it.
#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/tensor.h"

namespace cpf::raw {

enum class CastActivation { gelu, swiglu };

const char* cast_activation_name(CastActivation activation);

// h = activation(pre) in pre's dtype: (R, C) as above (the unfused path; the reference of the fused ops).
Tensor apply_cast_activation(const Tensor& pre, CastActivation activation);

// d_pre (pre's shape) from d_h (R, C): gelu'(pre) * d_h, or both halves of SwiGLU's gradient.
Tensor cast_activation_backward(const Tensor& grad_h, const Tensor& pre, CastActivation activation);

// () f32 = max |activation(pre)| (NaN when h holds one), as abs_max(apply_cast_activation(pre, activation)).
// computed (or null): set to h when the backend had no fused kernel for the shape and computed h itself (a
// caller about to cast h then casts that, rather than computing it twice), else left undefined.
Tensor activation_abs_max(const Tensor& pre, CastActivation activation, Tensor* computed = nullptr);

// quantize_fp8_transposed(apply_cast_activation(pre, activation), scale, fp8, amax_out, with_plain) without
// h: q (R, C) (or undefined), qt (C, R), amax_out folded with max |h|.
Fp8Transposed quantize_activation_fp8_transposed(const Tensor& pre, CastActivation activation, const Tensor& scale,
                                                 DType fp8, const Tensor& amax_out = Tensor(), bool with_plain = true);

}  // namespace cpf::raw
