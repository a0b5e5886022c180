#pragma once
// Optimizer: the update rule over named parameter lists, shared by AdamW and SGD.
//
// Parameters arrive as named lists (`nn::Module::named_parameters()` returns exactly this type), so
// optim does not depend on nn and state can be named after the parameter it belongs to: AdamW's first
// moment of "blocks.0.weight" is the state tensor "exp_avg.blocks.0.weight". Those names are what a
// checkpoint stores (framework/io/checkpoint.h).
//
// Parameters are grouped; each group has its own weight decay (norms and biases usually get none,
// see adamw.h). State is allocated at construction (zeros), so a checkpoint can be loaded into an
// optimizer that has not stepped yet: loading copies into the existing storage, it never replaces
// handles. State lives on the parameter's device, in the parameter's dtype for f32/f64 and in f32 for
// bf16 parameters (fp32 master state; the bf16 parameter is updated in f32 and rounded once).
//
// Gradient accumulation: backward adds into existing gradients (`grad += ...`), so calling backward
// on several micro-batches before one step() sums their gradients. Scale each micro-batch loss by
// 1/accum_steps (or, for token-weighted means, call scale_grads_ in grad_clip.h with 1/total_tokens
// once before the step) and call zero_grad() after step(). Parameters without a gradient (not
// reached by any backward since the last zero_grad) are skipped by step(), weight decay included.
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::optim {

using NamedTensor = std::pair<std::string, Tensor>;
using NamedTensors = std::vector<NamedTensor>;

struct ParamGroup {
  std::string name;  // for messages and logs ("decay", "no_decay", ...)
  NamedTensors params;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "adamw", "sgd": also recorded in checkpoints.
  const std::string& name() const { return name_; }

  // Applies one update to every parameter that has a gradient, under NoGradGuard, then advances the
  // step count. Throws before changing anything if a gradient's shape, dtype or device is wrong.
  void step();
  // The step with its skip decided where the parameters are, so a GPU step needs no read-back before the
  // update is enqueued (docs/training.md, "Host synchronisation in a step"). skip_if_nonfinite is a (1)
  // f64 tensor, a gradient sum of squares (grad_clip.h grad_sum_squares): the update of step
  // step_count() + 1 is applied unless the square root of its value is not finite, in which case no
  // parameter or state changes. AdamW on a GPU decides in its kernel; elsewhere (the CPU, SGD) the value
  // is read here and the same rule applied. The step count does not move until commit(applied), called
  // once the caller has the value on the host: applied = std::isfinite(std::sqrt(value)). Until then
  // step(), step(Tensor) and load_state throw. Same parameters, state and counts as reading the norm
  // first and calling step() only when it is finite.
  void step(const Tensor& skip_if_nonfinite);
  // Ends the step(Tensor) in flight: advances the step count when `applied`. Throws without one, or
  // when the value was read here and `applied` disagrees with it.
  void commit(bool applied);
  // Ends the step(Tensor) in flight, or every step_deferred in flight, when their outcomes cannot be
  // known (the read-back of the value failed, e.g. a device error reported there): the step count stays,
  // and the parameters and state may or may not hold the updates, so restore them (load_state, a
  // checkpoint) before training on. Throws without a step in flight.
  void abandon();
  bool step_in_flight() const { return in_flight_; }

  // Several steps in flight (docs/optim.md, "Deferred steps"): enqueues the update of the next step as
  // step(skip_if_nonfinite) does, whose number t is the count of applied steps so far + 1 as the device
  // knows it, before the host knows whether the earlier deferred steps were applied. AdamW on a GPU keeps
  // that count on the device and picks its bias corrections there; elsewhere (the CPU, SGD, a fallback)
  // the value is read here, as step(Tensor) does, which needs every earlier deferred step decided on the
  // host too (throws otherwise). Refused while a step(Tensor) is in flight.
  void step_deferred(const Tensor& skip_if_nonfinite);
  // Ends the oldest applied.size() deferred steps in order, applied[i] = isfinite(sqrt(value of step i)):
  // the step count advances by the applied ones. Throws, changing nothing, when more outcomes are given
  // than steps are in flight, or one disagrees with a value read on the host.
  void settle(const std::vector<bool>& applied);
  // Deferred steps enqueued and not yet settled. step(), step(Tensor) and load_state throw while any is.
  int64_t deferred_in_flight() const { return static_cast<int64_t>(deferred_.size()); }
  // Drops every parameter's gradient (undefined, so the next backward allocates fresh ones).
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  // Number of completed step() calls (AdamW's bias correction uses it).
  int64_t step_count() const { return step_count_; }

  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // The state slots kept per parameter, e.g. {"exp_avg", "exp_avg_sq"}; empty for plain SGD.
  const std::vector<std::string>& state_slots() const { return slots_; }

  // Every state tensor as "<slot>.<parameter name>", slot-major, parameters in group order. The
  // handles share storage with the live state.
  NamedTensors state_tensors() const;
  // Throws unless `tensors` holds exactly the names of state_tensors() with the same shapes and dtypes
  // (order does not matter). Nothing is modified.
  void validate_state(const NamedTensors& tensors) const;
  // validate_state, then copies every tensor into the live state and sets the step count.
  void load_state(const NamedTensors& tensors, int64_t step_count);

 protected:
  // Validates the groups (defined, floating, leaf parameters that require grad; unique names and
  // tensors; finite weight decay >= 0; at least one parameter) and allocates zeroed state per slot.
  Optimizer(std::string name, std::vector<ParamGroup> groups, double lr, std::vector<std::string> slots);
  // The same validation, but the state is `adopted` ("<slot>.<parameter name>" for every slot and
  // parameter, each of the parameter's shape and state dtype), held as given, not allocated.
  Optimizer(std::string name, std::vector<ParamGroup> groups, std::vector<std::string> slots,
            const NamedTensors& adopted, int64_t step_count);

  // One parameter's update. `param` and `grad` are in the compute dtype (f32 for bf16 parameters,
  // already widened: the caller rounds `param` back), `state` holds one tensor per slot. `step` is the
  // 1-based number of the step being taken.
  virtual void update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state, double weight_decay,
                      int64_t step) = 0;

  // One parameter of a step as step() hands it to update_fused: the parameter and gradient in their own
  // dtype (not widened), its state tensors and its group's weight decay.
  struct FusedItem {
    Tensor param;
    Tensor grad;
    const std::vector<Tensor>* state;
    double weight_decay;
  };
  // Updates every item at once (e.g. one device kernel over all parameters) and returns true, or returns
  // false to have step() call update() per parameter. The default declines.
  // skip_if_nonfinite: undefined, or step(Tensor)'s tensor, which the fused update must honour on the
  // device (no change at all when the square root of its value is not finite).
  virtual bool update_fused(const std::vector<FusedItem>& /*items*/, int64_t /*step*/,
                            const Tensor& /*skip_if_nonfinite*/) {
    return false;
  }
  // The fused update of a deferred step whose number the device decides: first_step + j, j = the applied
  // steps the device counted beyond first_step - 1, 0 <= j < candidates. With `exact` the host knows the
  // count (first_step - 1, candidates == 1) and the implementation resets its device count to it. Returns
  // false to have the value read on the host instead (then step_deferred needs `exact`). The default declines.
  virtual bool update_fused_deferred(const std::vector<FusedItem>& /*items*/, int64_t /*first_step*/,
                                     int64_t /*candidates*/, bool /*exact*/, const Tensor& /*skip_if_nonfinite*/) {
    return false;
  }

 private:
  struct Entry {
    std::string name;
    Tensor param;
    std::vector<Tensor> state;  // one per slot
    double weight_decay = 0.0;
  };
  void check_lr(double lr) const;
  void check_gradients() const;
  std::vector<FusedItem> fused_items() const;
  void update_each(int64_t step);
  void check_skip_tensor(const Tensor& skip_if_nonfinite) const;
  void check_no_deferred(const char* what) const;

  std::string name_;
  std::vector<ParamGroup> groups_;
  std::vector<std::string> slots_;
  std::vector<Entry> entries_;
  double lr_ = 0.0;
  int64_t step_count_ = 0;
  bool in_flight_ = false;            // a step(Tensor) awaits its commit
  std::optional<bool> host_decided_;  // its decision when made on the host
  // Deferred steps in flight, oldest first: the decision when made on the host, else empty (device).
  std::deque<std::optional<bool>> deferred_;
};

// The dtype optimizer state and arithmetic use for a parameter of `dtype`: f32 for bf16, else itself.
DType state_dtype(DType dtype);

// Whether the usual recipe exempts a parameter from weight decay: tensors of rank < 2 (biases, norm
// gains) and names containing "norm", "bias" or "embed" (case-insensitive).
bool is_no_decay_param(const std::string& name, const Tensor& param);

// Splits `params` into group "decay" (weight_decay) and group "no_decay" (0) by is_no_decay_param, in
// that order, keeping the parameters' order within each; with decay_all everything goes to "decay".
// Empty groups are left out.
std::vector<ParamGroup> weight_decay_groups(const NamedTensors& params, double weight_decay, bool decay_all = false);

}  // namespace cpf::optim
