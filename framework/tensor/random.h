#pragma once
// Random tensors from the Philox counter-based stream (framework/core/philox.h). Element i of a draw
// is a pure function of (generator seed, generator offset at the draw + i), so the same numbers come
// out on any device and any thread count.
#include "framework/core/generator.h"
#include "framework/tensor/tensor.h"

namespace cpf {

// Uniform in [low, high).
Tensor uniform(const Shape& shape, double low, double high, TensorOptions options = {}, Generator* gen = nullptr);
Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);  // [0, 1)
Tensor normal(const Shape& shape, double mean, double stddev, TensorOptions options = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);  // N(0, 1)
// Uniform integers in [low, high), as i64 unless options say otherwise.
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = {.dtype = DType::i64},
               Generator* gen = nullptr);

}  // namespace cpf
