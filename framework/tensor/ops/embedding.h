#pragma once
// Embedding lookup and its gradient (non-differentiable kernels; cpf::embedding in
// framework/autograd/functions/nn.h wraps them).
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// weight (V, C) floating, ids (...) i32 or i64 with every id in [0, V) -> (..., C) of weight's dtype.
// An out-of-range id throws naming the id, its position in ids and V.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// grad (..., C), ids (...) -> dweight (num_rows, C) of grad's dtype: row v is the sum of grad over the
// positions whose id is v, in the fixed order of embedding_segment.h (ids in row-major order, a frequent
// id in segments; no atomics), so the result is bit-identical from run to run, for any thread count
// and on every device.
Tensor embedding_backward(const Tensor& grad, const Tensor& ids, int64_t num_rows);

}  // namespace cpf::raw
