#include "framework/autograd/grad_ready_hook.h"

#include "framework/autograd/node.h"

namespace cpf::autograd {

GradHookHandle::GradHookHandle(std::shared_ptr<AccumulateGrad> accumulator, uint64_t id)
    : accumulator_(std::move(accumulator)), id_(id) {}

GradHookHandle::~GradHookHandle() { remove(); }

GradHookHandle::GradHookHandle(GradHookHandle&& other) noexcept
    : accumulator_(std::move(other.accumulator_)), id_(other.id_) {
  other.accumulator_ = nullptr;
}

GradHookHandle& GradHookHandle::operator=(GradHookHandle&& other) noexcept {
  if (this != &other) {
    remove();
    accumulator_ = std::move(other.accumulator_);
    id_ = other.id_;
    other.accumulator_ = nullptr;
  }
  return *this;
}

void GradHookHandle::remove() {
  if (!accumulator_) return;
  accumulator_->remove_hook(id_);
  accumulator_ = nullptr;
}

GradHookHandle add_grad_ready_hook(const Tensor& leaf, GradReadyHook hook) {
  CPF_CHECK(leaf.defined(), "add_grad_ready_hook: the tensor is undefined");
  CPF_CHECK(leaf.is_leaf(), "add_grad_ready_hook: the tensor of shape ", leaf.shape(),
            " is not a leaf (it was computed by '", leaf.grad_fn()->name(),
            "'); gradients are only kept for leaves, hook the leaf it was computed from");
  CPF_CHECK(leaf.requires_grad(), "add_grad_ready_hook: the leaf of shape ", leaf.shape(),
            " does not require grad, so backward never reaches it; call set_requires_grad(true) first");
  CPF_CHECK(hook != nullptr, "add_grad_ready_hook: the hook for the leaf of shape ", leaf.shape(), " is empty");
  // The leaf's cached accumulator (created here when no graph uses the leaf yet); the handle owns
  // it from now on, so every later forward records edges into this same node.
  const Edge edge = gradient_edge(leaf);
  auto accumulator = std::dynamic_pointer_cast<AccumulateGrad>(edge.node);
  CPF_CHECK(accumulator != nullptr, "add_grad_ready_hook: the leaf of shape ", leaf.shape(),
            " has no gradient accumulator");
  const uint64_t id = accumulator->add_hook(std::move(hook));
  return GradHookHandle(std::move(accumulator), id);
}

}  // namespace cpf::autograd
