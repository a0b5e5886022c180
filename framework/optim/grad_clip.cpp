#include "framework/optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "framework/autograd/grad_mode.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/profile.h"

namespace cpf::optim {
namespace {

std::vector<Tensor> handles(const NamedTensors& params) {
  std::vector<Tensor> out;
  out.reserve(params.size());
  for (const auto& [name, p] : params) {
    CPF_CHECK(p.defined(), "gradient utilities: parameter '", name, "' is an undefined tensor");
    out.push_back(p);
  }
  return out;
}

std::vector<Tensor> gradients(const std::vector<Tensor>& params, const char* op) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    CPF_CHECK(params[i].defined(), op, ": parameter ", i, " is an undefined tensor");
    const Tensor g = params[i].grad();
    if (!g.defined()) continue;
    CPF_CHECK(is_floating(g.dtype()), op, ": gradient of parameter ", i, " has dtype ", g.dtype());
    grads.push_back(g);
  }
  return grads;
}

// (1) f64 on `d`: the sum of squares of the gradients on `d`, one sum_squares launch.
Tensor device_squares(const std::vector<Tensor>& grads, Device d) {
  std::vector<Tensor> on_device;
  for (const Tensor& g : grads) {
    if (g.device() == d && g.numel() > 0) on_device.push_back(g.is_contiguous() ? g : raw::contiguous(g));
  }
  const Tensor out = empty({1}, {.dtype = DType::f64, .device = d});
  device_kernel(d, &DeviceOps::sum_squares, "grad_norm")(out, on_device);
  double bytes = 0;
  for (const Tensor& g : on_device) bytes += profile::tensor_bytes(g);
  profile::add_work(0, bytes);
  return out;
}

double sum_of_squares(const std::vector<Tensor>& grads) {
  double sum_sq = 0.0;
  // Gradients on a device with a sum_squares kernel: one launch per device and one read-back, instead
  // of a reduction and a synchronisation per gradient.
  std::vector<Device> devices;
  for (const Tensor& g : grads) {
    const Device d = g.device();
    if (!d.is_cpu() && has_kernel(d, &DeviceOps::sum_squares) &&
        std::find(devices.begin(), devices.end(), d) == devices.end()) {
      devices.push_back(d);
    }
  }
  for (const Device& d : devices) sum_sq += device_squares(grads, d).item<double>();
  for (const Tensor& g : grads) {
    if (g.numel() == 0 || std::find(devices.begin(), devices.end(), g.device()) != devices.end()) continue;
    // Widen first: squares of f32 values summed in f64 neither overflow nor lose small terms.
    const Tensor wide = raw::to(g, DType::f64);
    sum_sq += raw::sum(raw::unary(raw::UnaryOp::square, wide)).item<double>();
  }
  return sum_sq;
}

double norm_of(const std::vector<Tensor>& grads) { return std::sqrt(sum_of_squares(grads)); }

void scale_all(const std::vector<Tensor>& grads, double factor) {
  NoGradGuard no_grad;
  for (const Tensor& g : grads) raw::mul_(g, factor);
}

// The clipping rule, shared by the host-decided and the device-decided paths (the CUDA clip kernel applies
// the same). A non-finite norm is reported, not applied: scaling would spread NaN everywhere. The epsilon
// keeps the factor finite for tiny norms; scaling only above the threshold makes norm == max_norm a no-op.
void clip_by_norm(const std::vector<Tensor>& grads, double norm, double max_norm) {
  if (std::isfinite(norm) && norm > max_norm) scale_all(grads, max_norm / (norm + 1e-6));
}

void check_max_norm(double max_norm, const char* op) {
  CPF_CHECK(std::isfinite(max_norm) && max_norm > 0, op, ": max_norm must be finite and > 0, got ", max_norm);
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) { return norm_of(gradients(params, "grad_norm")); }
double grad_norm(const NamedTensors& params) { return grad_norm(handles(params)); }

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  check_max_norm(max_norm, "clip_grad_norm_");
  const std::vector<Tensor> grads = gradients(params, "clip_grad_norm_");
  const double norm = norm_of(grads);
  clip_by_norm(grads, norm, max_norm);
  return norm;
}
double clip_grad_norm_(const NamedTensors& params, double max_norm) {
  return clip_grad_norm_(handles(params), max_norm);
}

void scale_grads_(const std::vector<Tensor>& params, double factor) {
  CPF_CHECK(std::isfinite(factor), "scale_grads_: factor must be finite, got ", factor);
  scale_all(gradients(params, "scale_grads_"), factor);
}
void scale_grads_(const NamedTensors& params, double factor) { scale_grads_(handles(params), factor); }

Tensor grad_sum_squares(const std::vector<Tensor>& params) {
  const std::vector<Tensor> grads = gradients(params, "grad_sum_squares");
  const Device device = params.empty() ? Device::cpu() : params.front().device();
  for (size_t i = 0; i < params.size(); ++i) {
    CPF_CHECK(params[i].device() == device, "grad_sum_squares: parameter ", i, " is on ", params[i].device(),
              " but parameter 0 is on ", device, "; the sum stays on one device (grad_norm adds up several)");
  }
  for (const Tensor& g : grads) {
    CPF_CHECK(g.device() == device, "grad_sum_squares: a gradient is on ", g.device(), " but the parameters are on ",
              device);
  }
  if (!device.is_cpu() && has_kernel(device, &DeviceOps::sum_squares)) return device_squares(grads, device);
  return full({1}, sum_of_squares(grads), {.dtype = DType::f64, .device = device});
}
Tensor grad_sum_squares(const NamedTensors& params) { return grad_sum_squares(handles(params)); }

void clip_grads_by_sum_squares_(const std::vector<Tensor>& params, const Tensor& sum_squares, double max_norm) {
  const char* op = "clip_grads_by_sum_squares_";
  check_max_norm(max_norm, op);
  CPF_CHECK(sum_squares.defined() && sum_squares.numel() == 1 && sum_squares.dtype() == DType::f64, op,
            ": sum_squares must be one f64 element (grad_sum_squares' result), got ",
            sum_squares.defined() ? str_cat(sum_squares.dtype(), " of shape ", sum_squares.shape()) : "undefined");
  const std::vector<Tensor> grads = gradients(params, op);
  const Device device = sum_squares.device();
  bool contiguous = true;
  for (const Tensor& g : grads) {
    CPF_CHECK(g.device() == device, op, ": a gradient is on ", g.device(), " but sum_squares is on ", device);
    contiguous = contiguous && g.is_contiguous();
  }
  if (!device.is_cpu() && contiguous && has_kernel(device, &DeviceOps::clip_by_norm_)) {
    // Decided and applied on the device: no read-back before the optimizer step is enqueued.
    device_kernel(device, &DeviceOps::clip_by_norm_, op)(grads, sum_squares, max_norm);
    for (const Tensor& g : grads) g.bump_version();
    return;
  }
  // The host decides (the CPU reference of the kernel): free on the CPU, a read-back on a device.
  clip_by_norm(grads, std::sqrt(sum_squares.item<double>()), max_norm);
}
void clip_grads_by_sum_squares_(const NamedTensors& params, const Tensor& sum_squares, double max_norm) {
  clip_grads_by_sum_squares_(handles(params), sum_squares, max_norm);
}

}  // namespace cpf::optim
