#pragma once
// Vectorised f32 exp, sigmoid, silu and gelu over contiguous arrays, built on the SIMD exp of
// softmax_kernels.h (libm's scalar expf/tanhf made these element-wise ops 10-50x slower than a copy).
//
// Accuracy: a few ulp (the exp is ~2 ulp). The logistic function is evaluated from e = exp(-|x|) in
// the form that has no cancellation on either side (1 / (1 + e) for x >= 0, e / (1 + e) below), so
// tiny sigmoids stay relatively accurate and large arguments give exactly 0 or 1, never NaN.
// exp results that would be subnormal (x < -87.3) are 0.
#include <cstdint>

namespace cpf::cpu {

enum class FastUnary { exp, sigmoid, silu, gelu };

// out[i] = op(x[i]) for i < n; out may equal x. Splits large arrays across OpenMP threads.
void fast_unary_f32(FastUnary op, const float* x, float* out, int64_t n);

}  // namespace cpf::cpu
