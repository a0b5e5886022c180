#pragma once
// FP8 casts and the FP8 GEMM with per-tensor scales, the raw ops under FP8 training (Hopper's FP8 tensor
// cores run at twice the bf16 rate). A tensor x goes to FP8 as q = fp8(x * scale), the scale chosen so
// that the largest |x| lands near the format's largest value; the GEMM multiplies the scales back:
//
//   quantize_fp8      q (fp8) = fp8(x * scale)          saturating, round to nearest even (float8.h)
//   fp8_matmul_nt     out = (a * a_scale_inv) @ (b * b_scale_inv)^T [+ bias]   f32 accumulation
//
// Every scale, inverse scale and amax is a () f32 tensor on the data's device, read and written there,
// so a scaling recipe runs without a host round trip and a CUDA graph can capture it. CPU kernels are
// the reference: they compute on the same quantised values (the products of two FP8 values are exact
// in f32; the sums are taken in f64), so the CUDA kernels must agree up to the order of f32 additions.
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// The largest finite value of an FP8 dtype: 448 (f8e4m3), 57344 (f8e5m2).
double fp8_max(DType fp8);

// () f32 = max |x| over x (f32, bf16 or f64), the amax of the FP8 recipes; NaN when x holds a NaN; 0 for an empty x.
Tensor abs_max(const Tensor& x);

// () f32 = the scale that maps `amax` (() f32) onto the format: fp8_max(fp8) / amax / 2^margin, where
// margin >= 0 leaves headroom for values growing between scale updates. When amax is 0, infinite or NaN
// the scale is `fallback` (() f32, e.g. the previous step's scale), or 1 when fallback is undefined: a
// non-finite amax must not turn every later cast into NaN.
Tensor fp8_scale(const Tensor& amax, DType fp8, int64_t margin = 0, const Tensor& fallback = Tensor());

// q (x's shape, contiguous, dtype fp8) = fp8(x * scale) with scale a () f32 on x's device; x f32 or bf16
// (the product is taken in f32). amax_out, when defined (() f32 on x's device), becomes
// max(amax_out, max |x|) in the same pass (delayed scaling records the amax of what it casts).
Tensor quantize_fp8(const Tensor& x, const Tensor& scale, DType fp8, const Tensor& amax_out = Tensor());

// quantize_fp8 of a 2-D x (R, C) that also writes the codes transposed, qt (C, R), in the same pass: the
// K-major copy a backward GEMM needs (dW = dY^T X reads X^T). with_plain false: q is left undefined.
// with_column_sums: also x summed over its rows, the bias gradient when x is a linear's output gradient
// (TransformerEngine's cast-transpose-dbias), from the same read of x on CUDA; the CPU sums in f64.
struct Fp8Transposed {
  Tensor q;            // (R, C) fp8, or undefined
  Tensor qt;           // (C, R) fp8
  Tensor column_sums;  // (C) f32, or undefined
};
Fp8Transposed quantize_fp8_transposed(const Tensor& x, const Tensor& scale, DType fp8,
                                      const Tensor& amax_out = Tensor(), bool with_plain = true,
                                      bool with_column_sums = false);

// out (q's shape, contiguous, dtype `out`: f32 or bf16) = q * scale_inv, with scale_inv a () f32.
Tensor dequantize_fp8(const Tensor& q, const Tensor& scale_inv, DType out);

// out (M, N) of out_dtype (bf16 or f32) = (a * a_scale_inv) @ (b * b_scale_inv)^T + bias, the layout of a
// linear layer's forward (y = x W^T): a (M, K) and b (N, K) contiguous FP8 (not both f8e5m2), scales
// () f32 on their device, bias (N) of out_dtype or undefined. On CUDA it is cuBLASLt's FP8 GEMM, which
// needs a GPU of compute capability 8.9 or later and K, N multiples of 16. fast_accumulation: on CUDA,
// cuBLASLt's FP8 fast accumulation (the tensor cores' partial sums are not periodically promoted to f32:
// faster, less exact; TransformerEngine's choice for the forward GEMM); the CPU always sums exactly.
Tensor fp8_matmul_nt(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b, const Tensor& b_scale_inv,
                     DType out_dtype, const Tensor& bias = Tensor(), bool fast_accumulation = false);

}  // namespace cpf::raw
