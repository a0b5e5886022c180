#include "framework/tensor/ops/cast_many.h"

#include <string>

#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::raw {

std::vector<Tensor> to_many(const std::vector<Tensor>& srcs, DType dtype) {
  const char* op = "to_many";
  CPF_CHECK(is_floating(dtype), op, ": the target dtype must be floating (f32, f64 or bf16), got ", dtype);
  for (size_t i = 0; i < srcs.size(); ++i) {
    CPF_CHECK(srcs[i].defined(), op, ": tensor ", i, " of ", srcs.size(), " is undefined");
    CPF_CHECK(is_floating(srcs[i].dtype()), op, ": tensor ", i, " is ", srcs[i].dtype(),
              "; only floating tensors are converted");
  }
  std::vector<Tensor> out(srcs.size());
  // Per device: the f32 -> bf16 conversions go to the multi-tensor kernel, the rest through raw::to.
  std::vector<Tensor> dst_group, src_group;
  const auto flush = [&]() {
    if (dst_group.empty()) return;
    device_kernel(dst_group[0].device(), &DeviceOps::cast_many, op)(dst_group, src_group);
    for (const Tensor& d : dst_group) d.bump_version();
    dst_group.clear();
    src_group.clear();
  };
  for (size_t i = 0; i < srcs.size(); ++i) {
    const Tensor& s = srcs[i];
    const bool batched = s.dtype() == DType::f32 && dtype == DType::bf16 && !s.device().is_cpu() &&
                         has_kernel(s.device(), &DeviceOps::cast_many);
    if (!batched || s.numel() == 0) {
      out[i] = to(s, dtype);
      continue;
    }
    if (!dst_group.empty() && dst_group[0].device() != s.device()) flush();
    out[i] = empty(s.shape(), {.dtype = dtype, .device = s.device()});
    dst_group.push_back(out[i]);
    src_group.push_back(contiguous(s));
  }
  flush();
  return out;
}

}  // namespace cpf::raw
