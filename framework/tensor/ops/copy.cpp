#include "framework/tensor/ops/copy.h"

#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {

void copy_(const Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy_", "dst");
  check_defined(src, "copy_", "src");
  const Shape target = broadcast_shapes(dst.shape(), src.shape(), "copy_");
  CPF_CHECK(target == dst.shape(), "copy_: source of shape ", src.shape(), " cannot be broadcast to destination ",
            dst.shape());
  if (dst.numel() == 0) return;
  if (!dst.device().is_cpu() || !src.device().is_cpu()) {
    // Cross-device: stage through a contiguous tensor of the destination dtype on the source side.
    const Device device = dst.device().is_cpu() ? src.device() : dst.device();
    Tensor src_c = contiguous(to(src, dst.dtype()));
    CPF_CHECK(src.shape() == dst.shape() && dst.is_contiguous(),
              "copy_: cross-device copies need equal shapes and a contiguous destination, got src ", src.shape(),
              " dst ", dst.shape());
    device_backend(device.type).copy(dst.raw_data(), dst.device(), src_c.raw_data(), src_c.device(),
                                     static_cast<size_t>(dst.numel()) * dtype_size(dst.dtype()));
    dst.bump_version();
    return;
  }
  visit_dtype(dst.dtype(), [&]<class Out>() {
    visit_dtype(src.dtype(), [&]<class In>() {
      cpu::map_elements<Out, In>(dst, [](In x) {
        if constexpr (std::is_same_v<Out, bool>) {
          return static_cast<float>(x) != 0.0f;
        } else if constexpr (std::is_same_v<In, bfloat16> || std::is_same_v<Out, bfloat16>) {
          return Out(static_cast<float>(x));
        } else {
          return static_cast<Out>(x);
        }
      }, src);
    });
  });
  dst.bump_version();
}

void fill_(const Tensor& dst, double value) {
  check_defined(dst, "fill_", "dst");
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
  copy_(out, contiguous(t));
  return out;
}

}  // namespace cpf::raw
