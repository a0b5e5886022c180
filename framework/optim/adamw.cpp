#include "framework/optim/adamw.h"

#include <cmath>

#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/profile.h"

namespace cpf::optim {

void validate(const AdamWOptions& o) {
  CPF_CHECK(std::isfinite(o.lr) && o.lr >= 0, "adamw: lr must be finite and >= 0, got ", o.lr);
  CPF_CHECK(o.beta1 >= 0 && o.beta1 < 1, "adamw: beta1 must be in [0, 1), got ", o.beta1);
  CPF_CHECK(o.beta2 >= 0 && o.beta2 < 1, "adamw: beta2 must be in [0, 1), got ", o.beta2);
  CPF_CHECK(std::isfinite(o.eps) && o.eps > 0, "adamw: eps must be finite and > 0, got ", o.eps);
  CPF_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "adamw: weight_decay must be finite and >= 0, got ",
            o.weight_decay);
}

namespace {
const AdamWOptions& validated(const AdamWOptions& options) {
  validate(options);
  return options;
}
}  // namespace

AdamW::AdamW(const NamedTensors& params, const AdamWOptions& options)
    : AdamW(weight_decay_groups(params, validated(options).weight_decay, options.decay_all), options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Optimizer("adamw", std::move(groups), validated(options).lr, {"exp_avg", "exp_avg_sq"}), options_(options) {}

void AdamW::update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state, double weight_decay,
                   int64_t step) {
  const Tensor& exp_avg = state[0];
  const Tensor& exp_avg_sq = state[1];
  const double lr = this->lr();
  const double b1 = options_.beta1;
  const double b2 = options_.beta2;

  if (weight_decay != 0.0) raw::mul_(param, 1.0 - lr * weight_decay);
  raw::mul_(exp_avg, b1);
  raw::add_(exp_avg, grad, 1.0 - b1);
  raw::mul_(exp_avg_sq, b2);
  raw::add_(exp_avg_sq, raw::unary(raw::UnaryOp::square, grad), 1.0 - b2);

  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(b1, t);
  const double bias_correction2 = 1.0 - std::pow(b2, t);
  // denom = sqrt(v) / sqrt(bc2) + eps, built in one temporary (eps broadcast from a 0-d tensor).
  const Tensor denom = raw::unary(raw::UnaryOp::sqrt, exp_avg_sq);
  raw::mul_(denom, 1.0 / std::sqrt(bias_correction2));
  raw::add_(denom, full({}, options_.eps, {.dtype = denom.dtype(), .device = denom.device()}));
  raw::add_(param, raw::div(exp_avg, denom), -lr / bias_correction1);
}

bool AdamW::fused_params(const std::vector<FusedItem>& items, const Tensor& skip_if_nonfinite,
                         std::vector<DeviceAdamWParam>& params) const {
  if (items.empty()) return false;
  const Device device = items.front().param.device();
  if (device.is_cpu() || !has_kernel(device, &DeviceOps::adamw_step)) return false;
  if (skip_if_nonfinite.defined() && skip_if_nonfinite.device() != device) return false;  // decided on the host
  params.reserve(items.size());
  for (const FusedItem& item : items) {
    const Tensor& exp_avg = (*item.state)[0];
    const Tensor& exp_avg_sq = (*item.state)[1];
    if (item.param.device() != device || !item.param.is_contiguous() || !item.grad.is_contiguous() ||
        !exp_avg.is_contiguous() || !exp_avg_sq.is_contiguous()) {
      return false;
    }
    params.push_back({item.param, item.grad, exp_avg, exp_avg_sq, item.weight_decay});
  }
  return true;
}

namespace {

// A fused step's memory traffic for the profiler: it reads the parameter, gradient and both moments and
// writes the parameter and the moments back.
void report_adamw_work(const std::vector<DeviceAdamWParam>& params) {
  if (!profile::enabled()) return;
  double bytes = 0;
  for (const DeviceAdamWParam& p : params) {
    bytes += 2 * profile::tensor_bytes(p.param) + profile::tensor_bytes(p.grad) + 2 * profile::tensor_bytes(p.exp_avg) +
             2 * profile::tensor_bytes(p.exp_avg_sq);
  }
  profile::add_work(0, bytes);
}

}  // namespace

bool AdamW::update_fused(const std::vector<FusedItem>& items, int64_t step, const Tensor& skip_if_nonfinite) {
  std::vector<DeviceAdamWParam> params;
  if (!fused_params(items, skip_if_nonfinite, params)) return false;
  const DeviceAdamW hyper{.lr = lr(),
                          .beta1 = options_.beta1,
                          .beta2 = options_.beta2,
                          .eps = options_.eps,
                          .step = step,
                          .skip_if_nonfinite = skip_if_nonfinite,
                          .applied_steps = Tensor(),
                          .candidates = 1,
                          .reset_applied_steps = false};
  device_kernel(items.front().param.device(), &DeviceOps::adamw_step, "adamw")(params, hyper);
  report_adamw_work(params);
  return true;
}

bool AdamW::update_fused_deferred(const std::vector<FusedItem>& items, int64_t first_step, int64_t candidates,
                                  bool exact, const Tensor& skip_if_nonfinite) {
  std::vector<DeviceAdamWParam> params;
  if (!fused_params(items, skip_if_nonfinite, params)) return false;
  const Device device = items.front().param.device();
  // The device's count of applied steps: (1) i64 next to the parameters, reset whenever the host knows it.
  if (!applied_steps_.defined() || applied_steps_.device() != device) {
    CPF_CHECK(exact, "adamw: the device count of applied steps is missing while deferred steps are in flight");
    applied_steps_ = empty({1}, {.dtype = DType::i64, .device = device});
  }
  const DeviceAdamW hyper{.lr = lr(),
                          .beta1 = options_.beta1,
                          .beta2 = options_.beta2,
                          .eps = options_.eps,
                          .step = first_step,
                          .skip_if_nonfinite = skip_if_nonfinite,
                          .applied_steps = applied_steps_,
                          .candidates = candidates,
                          .reset_applied_steps = exact};
  device_kernel(device, &DeviceOps::adamw_step, "adamw")(params, hyper);
  report_adamw_work(params);
  return true;
}

}  // namespace cpf::optim
