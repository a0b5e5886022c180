#pragma once
// Gradient-ready hooks: code that must act on a leaf's gradient as soon as it is complete, while the
// rest of backward still runs (data parallelism starts a bucket's all-reduce from here).
//
//   autograd::GradHookHandle h = autograd::add_grad_ready_hook(w, [](const Tensor& leaf) {
//     use(leaf.grad());  // final for this backward call
//   });
//   backward(loss);      // the hook fires once, when w's gradient is complete
//
// When it fires: once per backward() call for every leaf that the roots depend on (a leaf reached
// through several paths fires once, after all of its contributions were added), after the
// contributions were added to leaf.grad(), before backward() returns. A leaf the roots do not depend
// on does not fire. A leaf that is in the graph but receives no gradient (every path into it
// returned none) fires with leaf.grad() as it was before (undefined after zero_grad). Several
// hooks of one leaf fire in registration order. Hooks run on the thread that called backward(),
// with gradient recording off; an exception thrown by a hook leaves backward() with that exception.
//
// The handle removes the hook when destroyed (or on remove()); while a hook is registered, the
// leaf's gradient accumulator node stays alive, and the handle keeps the leaf alive.
#include <functional>
#include <memory>

#include "framework/tensor/tensor.h"

namespace cpf::autograd {

class AccumulateGrad;
using GradReadyHook = std::function<void(const Tensor& leaf)>;

// Move-only owner of one registered hook.
class GradHookHandle {
 public:
  GradHookHandle() = default;
  GradHookHandle(std::shared_ptr<AccumulateGrad> accumulator, uint64_t id);
  ~GradHookHandle();
  GradHookHandle(GradHookHandle&& other) noexcept;
  GradHookHandle& operator=(GradHookHandle&& other) noexcept;
  GradHookHandle(const GradHookHandle&) = delete;
  GradHookHandle& operator=(const GradHookHandle&) = delete;

  // Unregisters the hook (no-op when already removed or empty).
  void remove();
  bool active() const { return accumulator_ != nullptr; }

 private:
  std::shared_ptr<AccumulateGrad> accumulator_;
  uint64_t id_ = 0;
};

// Registers `hook` on `leaf`, which must be a leaf tensor that requires grad.
[[nodiscard]] GradHookHandle add_grad_ready_hook(const Tensor& leaf, GradReadyHook hook);

}  // namespace cpf::autograd
