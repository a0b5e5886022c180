#pragma once
// Rotary position embedding (non-differentiable kernel; cpf::rope in framework/autograd/functions/nn.h
// wraps it).
//
// Half-split convention (GPT-NeoX / Llama): with R = rotary_dim and h = R / 2, pair i < h is
// (x[i], x[i + h]), rotated by the angle pos * base^(-2i / R):
//   y[i]     = x[i] cos - x[i + h] sin
//   y[i + h] = x[i + h] cos + x[i] sin
// Dims >= R pass through unchanged. Angles and their sin/cos are computed in double, then applied in
// the compute dtype (f32 for f32/bf16, f64 for f64). The RopeFrequencies forms take Llama 3's frequency
// scaling too (rope_frequencies.h); the `base` forms are those with no scaling.
#include "framework/tensor/rope_frequencies.h"
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// x (B, T, H, D) [bshd] with positions (T) or (B, T), or x (T, H, D) [thd] with positions (T);
// positions are i32 or i64 (any value, negative included). rotary_dim = -1 means D; otherwise it must
// be even and in (0, D]. inverse = true rotates by -angle (the inverse, and the transpose, of the
// rotation). Returns a new contiguous tensor of x's shape and dtype; x only needs a unit stride along D.
Tensor rope(const Tensor& x, const Tensor& positions, double base = 10000.0, int64_t rotary_dim = -1,
            bool inverse = false);
Tensor rope(const Tensor& x, const Tensor& positions, const RopeFrequencies& frequencies, int64_t rotary_dim = -1,
            bool inverse = false);

// The rotation is orthogonal, so its gradient is the opposite rotation of grad_y.
Tensor rope_backward(const Tensor& grad_y, const Tensor& positions, double base = 10000.0, int64_t rotary_dim = -1,
                     bool inverse = false);
Tensor rope_backward(const Tensor& grad_y, const Tensor& positions, const RopeFrequencies& frequencies,
                     int64_t rotary_dim = -1, bool inverse = false);

}  // namespace cpf::raw
