#include "framework/optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "framework/autograd/grad_mode.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"

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

double norm_of(const std::vector<Tensor>& grads) {
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
  for (const Device& d : devices) {
    std::vector<Tensor> on_device;
    for (const Tensor& g : grads) {
      if (g.device() == d && g.numel() > 0) on_device.push_back(g.is_contiguous() ? g : raw::contiguous(g));
    }
    const Tensor out = empty({1}, {.dtype = DType::f64, .device = d});
    device_kernel(d, &DeviceOps::sum_squares, "grad_norm")(out, on_device);
    sum_sq += out.item<double>();
  }
  for (const Tensor& g : grads) {
    if (g.numel() == 0 || std::find(devices.begin(), devices.end(), g.device()) != devices.end()) continue;
    // Widen first: squares of f32 values summed in f64 neither overflow nor lose small terms.
    const Tensor wide = raw::to(g, DType::f64);
    sum_sq += raw::sum(raw::unary(raw::UnaryOp::square, wide)).item<double>();
  }
  return std::sqrt(sum_sq);
}

void scale_all(const std::vector<Tensor>& grads, double factor) {
  NoGradGuard no_grad;
  for (const Tensor& g : grads) raw::mul_(g, factor);
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) { return norm_of(gradients(params, "grad_norm")); }
double grad_norm(const NamedTensors& params) { return grad_norm(handles(params)); }

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  CPF_CHECK(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm_: max_norm must be finite and > 0, got ",
            max_norm);
  const std::vector<Tensor> grads = gradients(params, "clip_grad_norm_");
  const double norm = norm_of(grads);
  if (!std::isfinite(norm)) return norm;  // reported, not applied: scaling would spread NaN everywhere
  // The epsilon keeps the factor finite for tiny norms; scaling only above the threshold makes
  // norm == max_norm a no-op.
  if (norm > max_norm) scale_all(grads, max_norm / (norm + 1e-6));
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

}  // namespace cpf::optim
