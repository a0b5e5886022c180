#include "framework/tensor/ops/fp8_scale_update.h"

#include <algorithm>
#include <cmath>

#include "framework/tensor/device_ops.h"

namespace cpf::raw {
namespace {

constexpr const char* kOp = "fp8_update_scales";

void check_f32(const Tensor& t, const char* what, Shape shape, Device device) {
  CPF_CHECK(t.defined(), kOp, ": ", what, " is undefined");
  CPF_CHECK(t.dtype() == DType::f32 && t.shape() == shape && t.is_contiguous(), kOp, ": ", what,
            " must be a contiguous ", shape, " f32 tensor, got ", t.shape(), " ", dtype_name(t.dtype()),
            t.is_contiguous() ? "" : " (not contiguous)");
  CPF_CHECK(t.device() == device, kOp, ": ", what, " is on ", t.device(), " but history on ", device);
}

// Whether the step's flag (a one-element f32/f64 CPU tensor) holds a non-finite value.
bool cpu_flag_nonfinite(const Tensor& flag) {
  if (!flag.defined()) return false;
  const double v = flag.dtype() == DType::f64 ? *static_cast<const double*>(flag.raw_data())
                                              : *static_cast<const float*>(flag.raw_data());
  return !std::isfinite(v);
}

void cpu_update(const Tensor& history, const Tensor& amax, const Tensor& scale, const Tensor& fp8_max, int64_t margin,
                AmaxCompute compute, bool skip_step, float* clipped) {
  const int64_t entries = history.size(0), length = history.size(1);
  auto* h = static_cast<float*>(history.raw_data());
  auto* a = static_cast<float*>(amax.raw_data());
  auto* s = static_cast<float*>(scale.raw_data());
  const auto* m = static_cast<const float*>(fp8_max.raw_data());
  for (int64_t e = 0; e < entries; ++e) {
    float* row = h + e * length;
    if (!skip_step && std::isfinite(a[e])) {
      const bool had_history = *std::max_element(row, row + length) > 0.0f;
      if (clipped != nullptr && had_history && static_cast<double>(a[e]) * s[e] > static_cast<double>(m[e])) {
        *clipped += 1.0f;
      }
      std::copy_backward(row, row + length - 1, row + length);
      row[0] = a[e];
    }
    a[e] = 0.0f;
    const float used = compute == AmaxCompute::max ? *std::max_element(row, row + length) : row[0];
    // As fp8_scale computes it: the quotient in double, then one rounding to f32.
    if (std::isfinite(used) && used > 0.0f) {
      s[e] = static_cast<float>(static_cast<double>(m[e]) / static_cast<double>(used) / std::ldexp(1.0, margin));
    }
  }
}

}  // namespace

void fp8_update_scales(const Tensor& history, const Tensor& amax, const Tensor& scale, const Tensor& fp8_max,
                       int64_t margin, AmaxCompute compute, const Tensor& skip_if_nonfinite, const Tensor& clipped) {
  CPF_CHECK(history.defined() && history.dim() == 2 && history.size(1) >= 1, kOp,
            ": history must be an (entries, length >= 1) f32 tensor, got ",
            history.defined() ? history.shape() : Shape{});
  const Device device = history.device();
  const int64_t entries = history.size(0);
  check_f32(history, "history", history.shape(), device);
  check_f32(amax, "amax", {entries}, device);
  check_f32(scale, "scale", {entries}, device);
  check_f32(fp8_max, "fp8_max", {entries}, device);
  CPF_CHECK(margin >= 0 && margin <= 64, kOp, ": margin must be in [0, 64], got ", margin);
  if (skip_if_nonfinite.defined()) {
    CPF_CHECK(skip_if_nonfinite.numel() == 1 &&
                  (skip_if_nonfinite.dtype() == DType::f32 || skip_if_nonfinite.dtype() == DType::f64),
              kOp, ": skip_if_nonfinite must be a one-element f32 or f64 tensor, got ", skip_if_nonfinite.shape(), " ",
              dtype_name(skip_if_nonfinite.dtype()));
    CPF_CHECK(skip_if_nonfinite.device() == device, kOp, ": skip_if_nonfinite is on ", skip_if_nonfinite.device(),
              " but history on ", device);
  }
  if (clipped.defined()) check_f32(clipped, "clipped", {}, device);
  if (entries == 0) return;
  if (device.is_cpu()) {
    cpu_update(history, amax, scale, fp8_max, margin, compute, cpu_flag_nonfinite(skip_if_nonfinite),
               clipped.defined() ? static_cast<float*>(clipped.raw_data()) : nullptr);
    return;
  }
  device_kernel(device, &DeviceOps::fp8_update_scales, kOp)(
      history, amax, scale, fp8_max, margin, compute == AmaxCompute::most_recent, skip_if_nonfinite, clipped);
}

}  // namespace cpf::raw
