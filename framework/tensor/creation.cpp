#include <cmath>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/shape_utils.h"
#include "framework/tensor/tensor.h"

namespace cpf {

Tensor make_tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype) {
  CPF_CHECK(shape.size() == strides.size(), "make_tensor: shape ", shape, " and strides ", strides, " differ in rank");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor empty(const Shape& shape, TensorOptions options) {
  for (int64_t s : shape) CPF_CHECK(s >= 0, "empty: negative dimension in shape ", shape);
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(options.dtype);
  auto storage = std::make_shared<Storage>(nbytes, options.device);
  Tensor t = make_tensor(std::move(storage), shape, contiguous_strides(shape), 0, options.dtype);
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions options) {
  const bool requires_grad = options.requires_grad;
  options.requires_grad = false;
  Tensor t = empty(shape, options);
  device_backend(options.device.type).fill_zero(t.raw_data(), t.storage()->nbytes(), options.device);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor full(const Shape& shape, double value, TensorOptions options) {
  const bool requires_grad = options.requires_grad;
  options.requires_grad = false;
  Tensor t = empty(shape, options);
  raw::fill_(t, value);  // a device fill kernel, or a broadcast copy from the host without one
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }
Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  CPF_CHECK(step != 0.0, "arange: step must be non-zero");
  CPF_CHECK((end - start) / step >= 0, "arange: step ", step, " does not move from ", start, " towards ", end);
  const auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor host = empty({n}, {.dtype = DType::f64});
  double* p = host.data<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = start + static_cast<double>(i) * step;
  Tensor out = raw::to(raw::to(host, options.dtype), options.device);
  if (options.requires_grad) out.set_requires_grad(true);
  return out;
}

Tensor arange(int64_t end, TensorOptions options) { return arange(0.0, static_cast<double>(end), 1.0, options); }

Tensor from_buffer(const void* host_data, const Shape& shape, DType dtype, Device device) {
  Tensor out = empty(shape, {.dtype = dtype, .device = device});
  const size_t nbytes = static_cast<size_t>(out.numel()) * dtype_size(dtype);
  CPF_CHECK(host_data != nullptr || nbytes == 0, "from_buffer: null host pointer for shape ", shape);
  device_backend(device.type).copy(out.raw_data(), device, host_data, Device::cpu(), nbytes);
  return out;
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor full_like(const Tensor& t, double value) {
  return full(t.shape(), value, {.dtype = t.dtype(), .device = t.device()});
}

}  // namespace cpf
