#pragma once
// Copies and conversions (non-differentiable; the autograd layer wraps them).
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// dst[...] = src broadcast to dst's shape, converted to dst's dtype, across devices. Bumps dst's version.
// Devices with copy kernels (framework/tensor/device_ops.h) copy on the device, any strides; without
// them device tensors go through the host with the backend's byte copies and a device dst must be contiguous.
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);
void zero_(const Tensor& dst);
Tensor contiguous(const Tensor& t);         // t itself when already contiguous
Tensor clone(const Tensor& t);              // always a new contiguous tensor
Tensor to(const Tensor& t, DType dtype);    // t itself when already of that dtype
Tensor to(const Tensor& t, Device device);  // t itself when already there

}  // namespace cpf::raw
