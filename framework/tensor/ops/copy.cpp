#include "framework/tensor/ops/copy.h"

#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {

namespace {

// The values of a device tensor as a host tensor of the same dtype and shape, using only the
// backend's byte copies (no device kernels): the viewed bytes when contiguous, else the whole
// storage re-viewed with the same strides.
Tensor host_copy(const Tensor& t) {
  DeviceBackend& backend = device_backend(t.device().type);
  if (t.is_contiguous()) {
    Tensor host = empty(t.shape(), {.dtype = t.dtype()});
    backend.copy(host.raw_data(), Device::cpu(), t.raw_data(), t.device(),
                 static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
    return host;
  }
  const size_t nbytes = t.storage()->nbytes();
  auto storage = std::make_shared<Storage>(nbytes, Device::cpu());
  backend.copy(storage->data(), Device::cpu(), t.storage()->data(), t.device(), nbytes);
  return make_tensor(std::move(storage), t.shape(), t.strides(), t.offset(), t.dtype());
}

// With device copy kernels, copies stay on the device where they can: conversion, broadcasting and
// strides are the kernel's work and only contiguous bytes cross between devices. Returns false when
// a device involved has no copy kernel (the host-staged path in copy_ then does the copy).
bool copy_with_device_kernels(const Tensor& dst, const Tensor& src) {
  const Device dd = dst.device(), sd = src.device();
  const bool dst_kernel = !dd.is_cpu() && has_kernel(dd, &DeviceOps::copy);
  const bool src_kernel = !sd.is_cpu() && has_kernel(sd, &DeviceOps::copy);
  if (!(dd.is_cpu() || dst_kernel) || !(sd.is_cpu() || src_kernel)) return false;
  if (dst.numel() == 0) return true;
  if (dd == sd) {
    device_kernel(dd, &DeviceOps::copy, "copy_")(dst, src);
    dst.bump_version();
    return true;
  }
  // Between devices: the source's bytes, contiguous and in its own dtype (a broadcast source stays small).
  const Tensor src_c = contiguous(src);
  const size_t nbytes = static_cast<size_t>(src_c.numel()) * dtype_size(src_c.dtype());
  const Tensor staged = empty(src_c.shape(), {.dtype = src_c.dtype(), .device = dd});
  device_backend(dd.is_cpu() ? sd.type : dd.type).copy(staged.raw_data(), dd, src_c.raw_data(), sd, nbytes);
  copy_(dst, staged);  // on dst's device
  return true;
}

// FP8 tensors copy as bytes (no conversion: quantize_fp8 / dequantize_fp8 convert, with a scale): any
// strides on the CPU, contiguous tensors of one shape elsewhere.
void copy_fp8(const Tensor& dst, const Tensor& src) {
  CPF_CHECK(dst.dtype() == src.dtype(), "copy_: cannot convert ", dtype_name(src.dtype()), " to ",
            dtype_name(dst.dtype()), " (FP8 conversions take a scale: raw::quantize_fp8 and raw::dequantize_fp8)");
  if (dst.numel() == 0) return;
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    // One byte per element, moved as it is: the values are not looked at.
    cpu::map_elements<uint8_t, uint8_t>(
        dst, [](uint8_t x) { return x; }, src);
  } else {
    CPF_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape(), "copy_: copying ",
              dtype_name(dst.dtype()), " between ", src.device(), " and ", dst.device(),
              " needs contiguous tensors of one shape, got ", src.shape(), " strides ", src.strides(), " -> ",
              dst.shape(), " strides ", dst.strides());
    const DeviceType type = dst.device().is_cpu() ? src.device().type : dst.device().type;
    device_backend(type).copy(dst.raw_data(), dst.device(), src.raw_data(), src.device(),
                              static_cast<size_t>(dst.numel()));
  }
  dst.bump_version();
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy_", "dst");
  check_defined(src, "copy_", "src");
  const Shape target = broadcast_shapes(dst.shape(), src.shape(), "copy_");
  CPF_CHECK(target == dst.shape(), "copy_: source of shape ", src.shape(), " cannot be broadcast to destination ",
            dst.shape());
  if (is_fp8(dst.dtype()) || is_fp8(src.dtype())) return copy_fp8(dst, src);
  if ((!dst.device().is_cpu() || !src.device().is_cpu()) && copy_with_device_kernels(dst, src)) return;
  CPF_CHECK(dst.device().is_cpu() || dst.is_contiguous(), "copy_: writing into a ", dst.device(),
            " tensor needs a contiguous destination, got shape ", dst.shape(), " strides ", dst.strides());
  if (dst.numel() == 0) return;
  if (!src.device().is_cpu()) {
    // Bring the source to the host; broadcasting, strides and dtype are then handled below.
    copy_(dst, host_copy(src));
    return;
  }
  if (!dst.device().is_cpu()) {
    // Convert on the host into a contiguous staging tensor, then one byte copy to the device.
    Tensor staged = empty(dst.shape(), {.dtype = dst.dtype()});
    copy_(staged, src);
    device_backend(dst.device().type)
        .copy(dst.raw_data(), dst.device(), staged.raw_data(), Device::cpu(),
              static_cast<size_t>(dst.numel()) * dtype_size(dst.dtype()));
    dst.bump_version();
    return;
  }
  visit_dtype(dst.dtype(), [&]<class Out>() {
    visit_dtype(src.dtype(), [&]<class In>() {
      cpu::map_elements<Out, In>(
          dst,
          [](In x) {
            if constexpr (std::is_same_v<Out, bool> && std::is_same_v<In, bfloat16>) {
              return static_cast<float>(x) != 0.0f;
            } else if constexpr (std::is_same_v<Out, bool>) {
              return x != In(0);  // in the source type: a double 1e-300 is non-zero but rounds to float 0
            } else if constexpr (std::is_same_v<In, bfloat16> || std::is_same_v<Out, bfloat16>) {
              return Out(static_cast<float>(x));
            } else {
              return static_cast<Out>(x);
            }
          },
          src);
    });
  });
  dst.bump_version();
}

void fill_(const Tensor& dst, double value) {
  check_defined(dst, "fill_", "dst");
  if (!dst.device().is_cpu() && has_kernel(dst.device(), &DeviceOps::fill)) {
    device_kernel(dst.device(), &DeviceOps::fill, "fill_")(dst, value);
    dst.bump_version();
    return;
  }
  if (!dst.device().is_cpu()) {
    copy_(dst, full({}, value, {.dtype = dst.dtype(), .device = Device::cpu()}));
    return;
  }
  visit_dtype(dst.dtype(), [&]<class T>() {
    const T v = std::is_same_v<T, bfloat16> ? T(static_cast<float>(value)) : static_cast<T>(value);
    cpu::map_elements<T>(dst, [v]() { return v; });
  });
  dst.bump_version();
}

void zero_(const Tensor& dst) { fill_(dst, 0.0); }

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});
  copy_(out, t);
  return out;
}

Tensor to(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.shape(), {.dtype = dtype, .device = t.device()});
  copy_(out, t);
  return out;
}

Tensor to(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  Tensor out = empty(t.shape(), {.dtype = t.dtype(), .device = device});
  copy_(out, t);
  return out;
}

}  // namespace cpf::raw
