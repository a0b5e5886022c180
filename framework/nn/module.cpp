#include "framework/nn/module.h"

#include "framework/tensor/ops/copy.h"

namespace cpf::nn {

void Module::check_new_name(const std::string& name) const {
  CPF_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module: invalid name '", name,
            "' (non-empty, without '.')");
  auto taken = [&](const auto& list) {
    for (const auto& entry : list) {
      if (entry.first == name) return true;
    }
    return false;
  };
  CPF_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), "Module: name '", name,
            "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check_new_name(name);
  CPF_CHECK(value.defined(), "Module: parameter '", name, "' is an undefined tensor");
  CPF_CHECK(value.is_leaf(), "Module: parameter '", name, "' must be a leaf tensor (detach it first)");
  value.set_requires_grad(true);
  parameters_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  buffers_.emplace_back(name, value);
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  CPF_CHECK(module != nullptr, "Module: child '", name, "' is null");
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, bool buffers, std::vector<NamedTensor>& out) const {
  for (const auto& [name, tensor] : buffers ? buffers_ : parameters_) out.emplace_back(prefix + name, tensor);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", buffers, out);
}

std::vector<NamedTensor> Module::named_parameters() const {
  std::vector<NamedTensor> out;
  collect("", false, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, tensor] : named_parameters()) out.push_back(tensor);
  return out;
}

std::vector<NamedTensor> Module::named_buffers() const {
  std::vector<NamedTensor> out;
  collect("", true, out);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, tensor] : named_parameters()) n += tensor.numel();
  return n;
}

void Module::train(bool training) {
  training_ = training;
  for (auto& [name, child] : children_) child->train(training);
}

void Module::zero_grad() {
  for (auto& [name, tensor] : named_parameters()) tensor.set_grad(Tensor());
}

namespace {

// Re-points `t`'s TensorImpl at a copy of its values on `device` (contiguous), so every holder of the
// handle sees the moved tensor.
void move_in_place(const Tensor& t, Device device) {
  if (!t.defined() || t.device() == device) return;
  const Tensor moved = raw::contiguous(raw::to(t, device));
  TensorImpl* impl = t.impl();
  impl->storage = moved.storage();
  impl->strides = moved.strides();
  impl->offset = moved.offset();
}

}  // namespace

void Module::to(Device device) {
  for (const auto& list : {named_parameters(), named_buffers()}) {
    for (const auto& [name, tensor] : list) {
      CPF_CHECK(tensor.is_leaf(), "Module::to: '", name, "' is not a leaf tensor; move modules before using them");
      move_in_place(tensor, device);
      move_in_place(tensor.grad(), device);
    }
  }
}

}  // namespace cpf::nn
