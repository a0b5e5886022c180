#pragma once
// Merging partial attention results over disjoint key sets, in fp32 (f64 for f64 inputs):
//   L = log(sum_i exp(L_i)),   O = sum_i exp(L_i - L) * O_i
// A row that saw no key in any part keeps L = -inf and O = 0 (never NaN); a part whose L_i is -inf
// contributes nothing, whatever its O_i holds, and leaves the row untouched.
//
// One running (out, lse) pair per call, updated in place by every part: on the CPU by a host loop, on
// a device by the kernel its attention library registers (attention/cuda/lse_merge_kernel.cu: one pass
// over the part, reading it in its own dtype, no temporary), else by element-wise raw ops.
#include "framework/tensor/tensor.h"

namespace cpf::cp {

// Accumulator for one (out, lse) pair in thd layout: out (T, H, Dv), lse (H, T).
class PartialMerge {
 public:
  // Starts empty: lse = -inf, out = 0, in the accumulation dtype (f64 for f64 inputs, else f32), on
  // `device` (the parts' device).
  PartialMerge(int64_t tokens, int64_t heads, int64_t head_dim, DType input_dtype, Device device = Device::cpu());
  // Folds in a partial result (out_i (T, H, Dv) in any float dtype, lse_i (H, T) f32/f64), in place.
  void add(const Tensor& out_i, const Tensor& lse_i);
  const Tensor& lse() const { return lse_; }
  // The merged output converted to `dtype`.
  Tensor out(DType dtype) const;

 private:
  Tensor out_;  // (T, H, Dv)
  Tensor lse_;  // (H, T)
};

// The in-place merge step on one device: acc_out (T, H, D) and acc_lse (H, T) contiguous f32/f64,
// part_out (T, H, D) contiguous of any floating dtype, part_lse (H, T) contiguous of acc_lse's dtype;
// all on one device of the registered type. Computes exactly the host loop's formulas.
using DeviceMergeFn = void (*)(const Tensor& acc_out, const Tensor& acc_lse, const Tensor& part_out,
                               const Tensor& part_lse);
// Installs (or, with nullptr, removes) the kernel for a device type; the CUDA attention library
// registers its kernel when linked.
void register_device_merge(DeviceType type, DeviceMergeFn fn);
DeviceMergeFn device_merge(DeviceType type);  // nullptr when none is registered

}  // namespace cpf::cp

namespace cpf::cp {

// Gradient accumulation across ring steps (the dQ of every tile): acc += part, acc f32/f64 and
// contiguous, part of acc's shape in any floating dtype. A device with a registered kernel reads the
// part once in its own dtype (a bf16 tile's dQ widened in registers: no fp32 copy of the tile); the
// CPU and other devices add the part converted to acc's dtype (raw ops), the same function.
void accumulate(const Tensor& acc, const Tensor& part);

// The in-place step on one device: acc (any shape) contiguous f32/f64, part contiguous of acc's shape
// and any floating dtype, both on one device of the registered type.
using DeviceAccumulateFn = void (*)(const Tensor& acc, const Tensor& part);
void register_device_accumulate(DeviceType type, DeviceAccumulateFn fn);
DeviceAccumulateFn device_accumulate(DeviceType type);  // nullptr when none is registered

}  // namespace cpf::cp
