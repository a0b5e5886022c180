#include "framework/optim/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include "framework/autograd/grad_mode.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::optim {

DType state_dtype(DType dtype) { return dtype == DType::bf16 ? DType::f32 : dtype; }

bool is_no_decay_param(const std::string& name, const Tensor& param) {
  if (param.dim() < 2) return true;
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* pattern : {"norm", "bias", "embed"}) {
    if (lower.find(pattern) != std::string::npos) return true;
  }
  return false;
}

std::vector<ParamGroup> weight_decay_groups(const NamedTensors& params, double weight_decay, bool decay_all) {
  ParamGroup decay{.name = "decay", .params = {}, .weight_decay = weight_decay};
  ParamGroup no_decay{.name = "no_decay", .params = {}, .weight_decay = 0.0};
  for (const auto& [name, param] : params) {
    CPF_CHECK(param.defined(), "weight_decay_groups: parameter '", name, "' is an undefined tensor");
    const bool exempt = !decay_all && is_no_decay_param(name, param);
    (exempt ? no_decay : decay).params.emplace_back(name, param);
  }
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, std::vector<std::string> slots,
                     const NamedTensors& adopted, int64_t step_count)
    : Optimizer(std::move(name), std::move(groups), 0.0, {}) {
  slots_ = std::move(slots);
  std::map<std::string, Tensor> by_name(adopted.begin(), adopted.end());
  for (Entry& entry : entries_) {
    for (const std::string& slot : slots_) {
      const auto it = by_name.find(slot + "." + entry.name);
      CPF_CHECK(it != by_name.end(), name_, ": the adopted state has no '", slot, ".", entry.name, "'");
      CPF_CHECK(it->second.shape() == entry.param.shape() && it->second.dtype() == state_dtype(entry.param.dtype()),
                name_, ": adopted state '", slot, ".", entry.name, "' is ", it->second.shape(), " ", it->second.dtype(),
                "; expected ", entry.param.shape(), " ", state_dtype(entry.param.dtype()));
      entry.state.push_back(it->second);
    }
  }
  CPF_CHECK(step_count >= 0, name_, ": step count ", step_count, " must be >= 0");
  step_count_ = step_count;
}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, double lr, std::vector<std::string> slots)
    : name_(std::move(name)), groups_(std::move(groups)), slots_(std::move(slots)), lr_(lr) {
  check_lr(lr);
  std::set<std::string> names;
  std::set<const TensorImpl*> impls;
  for (const ParamGroup& group : groups_) {
    CPF_CHECK(std::isfinite(group.weight_decay) && group.weight_decay >= 0, name_, ": weight_decay of group '",
              group.name, "' must be finite and >= 0, got ", group.weight_decay);
    for (const auto& [pname, param] : group.params) {
      CPF_CHECK(!pname.empty(), name_, ": a parameter of group '", group.name, "' has an empty name");
      CPF_CHECK(param.defined(), name_, ": parameter '", pname, "' is an undefined tensor");
      CPF_CHECK(is_floating(param.dtype()), name_, ": parameter '", pname, "' has dtype ", param.dtype(),
                "; only f32, f64 and bf16 parameters can be optimized");
      CPF_CHECK(param.is_leaf() && param.requires_grad(), name_, ": parameter '", pname,
                "' must be a leaf that requires grad (call set_requires_grad() on it)");
      CPF_CHECK(names.insert(pname).second, name_, ": parameter name '", pname, "' appears more than once");
      CPF_CHECK(impls.insert(param.impl()).second, name_, ": parameter '", pname,
                "' is the same tensor as an earlier parameter (tied weights must be listed once)");
      Entry entry{.name = pname, .param = param, .state = {}, .weight_decay = group.weight_decay};
      for (size_t s = 0; s < slots_.size(); ++s) {
        entry.state.push_back(zeros(param.shape(), {.dtype = state_dtype(param.dtype()), .device = param.device()}));
      }
      entries_.push_back(std::move(entry));
    }
  }
  CPF_CHECK(!entries_.empty(), name_, ": no parameters to optimize (", groups_.size(), " empty groups)");
}

void Optimizer::check_lr(double lr) const {
  CPF_CHECK(std::isfinite(lr) && lr >= 0, name_, ": lr must be finite and >= 0, got ", lr);
}

void Optimizer::set_lr(double lr) {
  check_lr(lr);
  lr_ = lr;
}

void Optimizer::check_gradients() const {
  CPF_CHECK(!in_flight_, name_, ": step ", step_count_ + 1,
            " was enqueued with step(skip_if_nonfinite) and not committed; call commit(applied) first");
  // Every gradient is checked before any parameter moves, so a bad one leaves the model untouched.
  for (const Entry& e : entries_) {
    const Tensor grad = e.param.grad();
    if (!grad.defined()) continue;
    CPF_CHECK(grad.shape() == e.param.shape(), name_, ": gradient of '", e.name, "' has shape ", grad.shape(),
              " but the parameter has shape ", e.param.shape());
    CPF_CHECK(grad.dtype() == e.param.dtype(), name_, ": gradient of '", e.name, "' is ", grad.dtype(),
              " but the parameter is ", e.param.dtype());
    CPF_CHECK(grad.device() == e.param.device(), name_, ": gradient of '", e.name, "' is on ", grad.device(),
              " but the parameter is on ", e.param.device());
  }
}

std::vector<Optimizer::FusedItem> Optimizer::fused_items() const {
  std::vector<FusedItem> items;
  for (const Entry& e : entries_) {
    const Tensor grad = e.param.grad();
    if (grad.defined()) items.push_back({e.param, grad, &e.state, e.weight_decay});
  }
  return items;
}

void Optimizer::update_each(int64_t step) {
  for (const Entry& e : entries_) {
    const Tensor grad = e.param.grad();
    if (!grad.defined()) continue;
    if (e.param.dtype() == DType::bf16) {
      // Update an f32 copy and round back once, so the arithmetic matches the f32 path.
      const Tensor work = raw::to(e.param, DType::f32);
      update(work, raw::to(grad, DType::f32), e.state, e.weight_decay, step);
      raw::copy_(e.param, work);
    } else {
      update(e.param, grad, e.state, e.weight_decay, step);
      e.param.bump_version();
    }
  }
}

void Optimizer::check_no_deferred(const char* what) const {
  CPF_CHECK(deferred_.empty(), name_, ": ", what, " while ", deferred_.size(),
            " deferred step(s) are in flight; call settle(applied) with their outcomes first");
}

void Optimizer::check_skip_tensor(const Tensor& skip_if_nonfinite) const {
  CPF_CHECK(skip_if_nonfinite.defined() && skip_if_nonfinite.numel() == 1 && skip_if_nonfinite.dtype() == DType::f64,
            name_, ": skip_if_nonfinite must be one f64 element (a gradient sum of squares), got ",
            skip_if_nonfinite.defined() ? str_cat(skip_if_nonfinite.dtype(), " of shape ", skip_if_nonfinite.shape())
                                        : "undefined");
}

void Optimizer::step() {
  check_no_deferred("step()");
  check_gradients();
  NoGradGuard no_grad;
  const int64_t step = step_count_ + 1;
  const std::vector<FusedItem> items = fused_items();
  if (update_fused(items, step, Tensor())) {
    for (const FusedItem& item : items) item.param.bump_version();
  } else {
    update_each(step);
  }
  step_count_ = step;
}

void Optimizer::step(const Tensor& skip_if_nonfinite) {
  check_skip_tensor(skip_if_nonfinite);
  check_no_deferred("step(skip_if_nonfinite)");
  check_gradients();
  NoGradGuard no_grad;
  const int64_t step = step_count_ + 1;
  const std::vector<FusedItem> items = fused_items();
  if (update_fused(items, step, skip_if_nonfinite)) {
    for (const FusedItem& item : items) item.param.bump_version();
    host_decided_.reset();
  } else {
    // The same rule on the host: free on the CPU, a read-back on a device.
    const bool applied = std::isfinite(std::sqrt(skip_if_nonfinite.item<double>()));
    if (applied) update_each(step);
    host_decided_ = applied;
  }
  in_flight_ = true;
}

void Optimizer::commit(bool applied) {
  CPF_CHECK(in_flight_, name_, ": commit without a step(skip_if_nonfinite) in flight");
  CPF_CHECK(!host_decided_ || *host_decided_ == applied, name_, ": commit(", applied ? "true" : "false",
            ") but the step's sum of squares read on the host says ", *host_decided_ ? "applied" : "skipped");
  in_flight_ = false;
  host_decided_.reset();
  if (applied) ++step_count_;
}

void Optimizer::step_deferred(const Tensor& skip_if_nonfinite) {
  check_skip_tensor(skip_if_nonfinite);
  check_gradients();
  NoGradGuard no_grad;
  // Decisions made on the host can only precede the device's (a host decision needs all earlier ones).
  int64_t known_applied = 0, undecided = 0;
  for (const std::optional<bool>& d : deferred_) {
    if (!d) ++undecided;
    if (d && *d) ++known_applied;
  }
  const int64_t first_step = step_count_ + known_applied + 1;
  const std::vector<FusedItem> items = fused_items();
  if (update_fused_deferred(items, first_step, undecided + 1, undecided == 0, skip_if_nonfinite)) {
    for (const FusedItem& item : items) item.param.bump_version();
    deferred_.emplace_back(std::nullopt);
    return;
  }
  CPF_CHECK(undecided == 0, name_, ": step_deferred reads its value on the host here (no fused update for these ",
            "parameters) but ", undecided, " earlier deferred step(s) were decided on the device, so its step number ",
            "is unknown; call settle(applied) with their outcomes first");
  const bool applied = std::isfinite(std::sqrt(skip_if_nonfinite.item<double>()));
  if (applied) update_each(first_step);
  deferred_.emplace_back(applied);
}

void Optimizer::settle(const std::vector<bool>& applied) {
  CPF_CHECK(applied.size() <= deferred_.size(), name_, ": settle of ", applied.size(), " outcome(s) but ",
            deferred_.size(), " deferred step(s) are in flight");
  for (size_t i = 0; i < applied.size(); ++i) {
    CPF_CHECK(!deferred_[i] || *deferred_[i] == applied[i], name_, ": settle outcome ", i, " is ",
              applied[i] ? "applied" : "skipped", " but that step's sum of squares read on the host says ",
              *deferred_[i] ? "applied" : "skipped");
  }
  for (const bool a : applied) {
    deferred_.pop_front();
    if (a) ++step_count_;
  }
}

void Optimizer::abandon() {
  CPF_CHECK(in_flight_ || !deferred_.empty(), name_,
            ": abandon without a step(skip_if_nonfinite) in flight (nor a step_deferred)");
  in_flight_ = false;
  host_decided_.reset();
  deferred_.clear();
}

void Optimizer::zero_grad() {
  for (const Entry& e : entries_) e.param.set_grad(Tensor());
}

NamedTensors Optimizer::state_tensors() const {
  NamedTensors out;
  out.reserve(slots_.size() * entries_.size());
  for (size_t s = 0; s < slots_.size(); ++s) {
    for (const Entry& e : entries_) out.emplace_back(slots_[s] + "." + e.name, e.state[s]);
  }
  return out;
}

void Optimizer::validate_state(const NamedTensors& tensors) const {
  std::map<std::string, const Tensor*> given;
  for (const auto& [tname, t] : tensors) {
    CPF_CHECK(given.emplace(tname, &t).second, name_, ": state tensor '", tname, "' is given more than once");
  }
  const NamedTensors expected = state_tensors();
  for (const auto& [ename, live] : expected) {
    const auto it = given.find(ename);
    CPF_CHECK(it != given.end(), name_, ": state tensor '", ename, "' is missing (", tensors.size(), " given, ",
              expected.size(), " expected)");
    const Tensor& t = *it->second;
    CPF_CHECK(t.defined(), name_, ": state tensor '", ename, "' is undefined");
    CPF_CHECK(t.shape() == live.shape(), name_, ": state tensor '", ename, "' has shape ", t.shape(),
              " but the optimizer expects ", live.shape());
    CPF_CHECK(t.dtype() == live.dtype(), name_, ": state tensor '", ename, "' is ", t.dtype(),
              " but the optimizer keeps ", live.dtype());
    given.erase(it);
  }
  CPF_CHECK(given.empty(), name_, ": unexpected state tensor '", given.empty() ? "" : given.begin()->first, "' (",
            given.size(), " not matching any parameter and slot)");
}

void Optimizer::load_state(const NamedTensors& tensors, int64_t step_count) {
  CPF_CHECK(!in_flight_, name_, ": load_state while step ", step_count_ + 1,
            " is in flight; call commit(applied) first");
  check_no_deferred("load_state");
  CPF_CHECK(step_count >= 0, name_, ": step count must be >= 0, got ", step_count);
  validate_state(tensors);
  std::map<std::string, Tensor> by_name(tensors.begin(), tensors.end());
  NoGradGuard no_grad;
  for (const auto& [ename, live] : state_tensors()) raw::copy_(live, by_name.at(ename));
  step_count_ = step_count;
}

}  // namespace cpf::optim
