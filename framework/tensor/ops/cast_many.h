#pragma once
// Many tensors converted to one dtype at once (non-differentiable): the per-step bf16 copies of a model's
// f32 parameters (framework/nn/compute_copies.h). On a device with the multi-tensor kernel every
// f32 -> bf16 conversion of the list runs in one launch (a handful for lists of hundreds), instead of a
// launch per tensor; values are exactly raw::to's (round to nearest even).
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::raw {

// result[i] = to(srcs[i], dtype): srcs[i] itself when already of that dtype, else a new contiguous tensor
// of srcs[i]'s shape on its device. Every source is defined and floating; they may sit on different devices.
std::vector<Tensor> to_many(const std::vector<Tensor>& srcs, DType dtype);

}  // namespace cpf::raw
