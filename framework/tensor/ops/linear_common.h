#pragma once
// Helpers shared by the linear raw ops (linear.cpp, linear_grad.cpp): internal to framework/tensor/ops.
#include <cstdint>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// t (..., C) as a contiguous (rows, C) matrix, rows the product of the leading dims.
inline Tensor flatten_rows(const Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return reshape(contiguous(t), {rows, t.size(-1)});
}

inline Shape with_last(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

// A device tensor of a dtype cuBLASLt's epilogues take (f32, bf16); the CPU always runs unfused.
inline bool epilogue_dtype_ok(const Tensor& t) {
  return !t.device().is_cpu() && (t.dtype() == DType::f32 || t.dtype() == DType::bf16);
}

// cuBLASLt reads epilogue vectors with wide loads: a view at an odd offset gets an aligned copy.
inline Tensor epilogue_vector(const Tensor& v) {
  const bool aligned = v.is_contiguous() && reinterpret_cast<uintptr_t>(v.raw_data()) % 16 == 0;
  return aligned ? v : clone(v);
}

}  // namespace cpf::raw
