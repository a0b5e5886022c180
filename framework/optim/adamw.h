#pragma once
// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization"), as torch.optim.AdamW:
//
//   p   <- p * (1 - lr * wd)                      decoupled decay, before the moment update
//   m   <- beta1 * m + (1 - beta1) * g            exp_avg
//   v   <- beta2 * v + (1 - beta2) * g^2          exp_avg_sq
//   p   <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// with t the 1-based step count (shared by all parameters). State: "exp_avg.<name>",
// "exp_avg_sq.<name>". The update is a handful of raw tensor ops per parameter (each a vectorised
// loop on CPU), so it runs wherever the raw ops do; parameters on a device whose kernel table has
// adamw_step (CUDA) are updated by one fused launch per parameter dtype, bit-identical to those ops.
#include "framework/optim/optimizer.h"

namespace cpf {
struct DeviceAdamWParam;  // framework/tensor/device_ops.h
}  // namespace cpf

namespace cpf::optim {

// Fields are the YAML keys of the `optimizer:` section (docs/optim.md).
struct AdamWOptions {
  double lr = 6e-4;           // peak learning rate; a schedule overrides it every step via set_lr
  double beta1 = 0.9;         // in [0, 1)
  double beta2 = 0.95;        // in [0, 1)
  double eps = 1e-8;          // > 0
  double weight_decay = 0.1;  // >= 0, decoupled (multiplied by lr)
  bool decay_all = false;     // also decay norms, biases, embeddings and 1-D tensors
};

// Throws naming the first invalid field.
void validate(const AdamWOptions& options);

class AdamW : public Optimizer {
 public:
  // Groups from weight_decay_groups(params, options.weight_decay, options.decay_all).
  AdamW(const NamedTensors& params, const AdamWOptions& options);
  // Explicit groups: each group's weight_decay is used and options.weight_decay/decay_all are ignored.
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options);

  const AdamWOptions& options() const { return options_; }

 protected:
  void update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state, double weight_decay,
              int64_t step) override;
  // Parameters on a device whose kernel table has adamw_step (all on one device, contiguous): one fused
  // launch per parameter dtype, rounded as update() rounds (device_ops.h). The kernel also makes the skip
  // decision of step(skip_if_nonfinite) when that tensor is on the parameters' device. Otherwise declines.
  bool update_fused(const std::vector<FusedItem>& items, int64_t step, const Tensor& skip_if_nonfinite) override;
  // The same launch for step_deferred: the kernel picks t from a count of applied steps kept on the device
  // (reset from the host when `exact`), with one set of bias-corrected scalars per candidate step, and adds
  // 1 to the count when the step is applied.
  bool update_fused_deferred(const std::vector<FusedItem>& items, int64_t first_step, int64_t candidates, bool exact,
                             const Tensor& skip_if_nonfinite) override;

 private:
  // The fused kernel's parameter list, or false when these items cannot take it.
  bool fused_params(const std::vector<FusedItem>& items, const Tensor& skip_if_nonfinite,
                    std::vector<DeviceAdamWParam>& params) const;

  AdamWOptions options_;
  Tensor applied_steps_;  // (1) i64 on the parameters' device: applied steps as the device counts them
};

}  // namespace cpf::optim
