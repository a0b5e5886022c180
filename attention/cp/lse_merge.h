#pragma once
// Merging partial attention results over disjoint key sets, in fp32 (f64 for f64 inputs):
//   L = log(sum_i exp(L_i)),   O = sum_i exp(L_i - L) * O_i
// A row that saw no key in any part keeps L = -inf and O = 0 (never NaN); a part whose L_i is -inf
// contributes nothing, whatever its O_i holds.
#include "framework/tensor/tensor.h"

namespace cpf::cp {

// Accumulator for one (out, lse) pair in thd layout: out (T, H, Dv), lse (H, T).
class PartialMerge {
 public:
  // Starts empty: lse = -inf, out = 0, in the accumulation dtype (f64 for f64 inputs, else f32), on
  // `device` (the parts' device: CPU tensors merge in one host loop, device tensors with raw ops).
  PartialMerge(int64_t tokens, int64_t heads, int64_t head_dim, DType input_dtype, Device device = Device::cpu());
  // Folds in a partial result (out_i in any float dtype, lse_i f32/f64).
  void add(const Tensor& out_i, const Tensor& lse_i);
  const Tensor& lse() const { return lse_; }
  // The merged output converted to `dtype`.
  Tensor out(DType dtype) const;

 private:
  Tensor out_;  // (T, H, Dv)
  Tensor lse_;  // (H, T)
};

}  // namespace cpf::cp
