#pragma once
// Differentiable neural-network ops: softmax, normalisations, embedding lookup, cross-entropy and
// rotary position embedding. Kernels and their exact semantics live in framework/tensor/ops/
// (softmax.h, norm.h, embedding.h, cross_entropy.h, rope.h); these wrappers record the backward.
// Integer inputs (ids, targets, positions) are never differentiated.
#include "framework/tensor/rope_frequencies.h"
#include "framework/tensor/tensor.h"

namespace cpf {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// Over the last dim of x (..., C); weight and bias are (C) or undefined (no affine transform).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// weight (V, C), ids (...) i32/i64 -> (..., C). The gradient of weight is accumulated deterministically.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// logits (N, C), targets (N) -> scalar mean loss over targets != ignore_index (0 when there are none).
// The loss is f32 for f32/bf16 logits, f64 for f64 logits.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

// x (B, T, H, D) with positions (T) or (B, T), or x (T, H, D) with positions (T); half-split pairs.
Tensor rope(const Tensor& x, const Tensor& positions, const RopeFrequencies& frequencies, int64_t rotary_dim = -1,
            bool inverse = false);
Tensor rope(const Tensor& x, const Tensor& positions, double base = 10000.0, int64_t rotary_dim = -1,
            bool inverse = false);

}  // namespace cpf
