#include "framework/autograd/checkpoint.h"

#include <memory>

#include "framework/autograd/engine.h"
#include "framework/autograd/forward_stash.h"
#include "framework/autograd/grad_mode.h"
#include "framework/autograd/node.h"
#include "framework/core/error.h"

namespace cpf::autograd {
namespace {

// Recording on for a scope (the engine runs nodes with it off); restores the previous mode.
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// Everything the backward needs: the region, its saved inputs and parameters, the stash.
struct Region {
  RegionFn fn;
  std::string name;
  std::vector<SavedTensor> inputs;
  std::vector<bool> input_needs_grad;
  std::vector<SavedTensor> params;  // unpack() throws when a parameter changed since the forward
  std::shared_ptr<ForwardStash> stash;
  std::function<void()> before, after;
};

// Calls `after` when the recompute ends, also by an exception (the sharded weights go back either way).
class AfterRecompute {
 public:
  explicit AfterRecompute(const std::function<void()>& after) : after_(after) {}
  ~AfterRecompute() {
    if (!after_) return;
    try {
      after_();
    } catch (...) {  // already unwinding, or the release failed: the first error is the one to report
    }
  }
  AfterRecompute(const AfterRecompute&) = delete;
  AfterRecompute& operator=(const AfterRecompute&) = delete;

 private:
  const std::function<void()>& after_;
};

// Runs the region again with recording on and backpropagates `grads` (one per output) through it.
GradList recompute_backward(Region& r, const GradList& grads) {
  if (r.before) r.before();
  const AfterRecompute after(r.after);
  for (const SavedTensor& p : r.params) p.unpack();
  EnableGradGuard grad_on;
  std::vector<Tensor> leaves;  // (shapes of the inputs) detached: the recomputed graph ends here
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const Tensor& saved = r.inputs[i].unpack();
    Tensor leaf = saved.defined() ? saved.detach() : Tensor();
    if (leaf.defined() && r.input_needs_grad[i]) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  std::vector<Tensor> outputs;
  if (r.stash) r.stash->start_replay();
  {
    ForwardStashScope scope(r.stash.get());
    outputs = r.fn(leaves);
  }
  if (r.stash) r.stash->check_consumed(r.name);
  CPF_CHECK(outputs.size() == grads.size(), "recompute[", r.name, "]: the recomputed region returned ", outputs.size(),
            " outputs, the first forward ", grads.size());
  std::vector<Tensor> roots, seeds;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!grads[i].defined() || !outputs[i].defined() || !outputs[i].requires_grad()) continue;
    roots.push_back(outputs[i]);
    seeds.push_back(grads[i]);
  }
  if (!roots.empty()) backward(roots, seeds);
  GradList result;
  for (size_t i = 0; i < leaves.size(); ++i) {
    result.push_back(leaves[i].defined() && r.input_needs_grad[i] ? leaves[i].grad() : Tensor());
  }
  return result;
}

}  // namespace

std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  CPF_CHECK(fn != nullptr, "checkpoint '", options.name, "': the region function is empty");
  if (!grad_enabled()) return fn(inputs);
  auto region = std::make_shared<Region>();
  region->fn = fn;
  region->name = options.name;
  region->before = options.before_recompute;
  region->after = options.after_recompute;
  if (options.policy == RecomputePolicy::selective) region->stash = std::make_shared<ForwardStash>();
  std::vector<Tensor> outputs;
  {
    // Recording on, as in the recompute, so both runs take the same kernels: the values match bit for bit.
    // A null stash also hides an enclosing region's one (nesting).
    ForwardStashScope scope(region->stash.get());
    outputs = fn(inputs);
  }
  bool any_output_needs_grad = false;
  for (const Tensor& o : outputs) any_output_needs_grad |= o.defined() && o.requires_grad();
  if (!any_output_needs_grad) return outputs;

  for (const Tensor& t : inputs) {
    region->inputs.emplace_back(t);
    region->input_needs_grad.push_back(t.defined() && t.requires_grad());
  }
  for (const Tensor& p : options.params) region->params.emplace_back(p);
  NodeInputs in = node_inputs(inputs);
  auto node = std::make_shared<FunctionNode>(
      "recompute[" + options.name + "]", [region](const GradList& grads) { return recompute_backward(*region, grads); },
      std::move(in.edges), std::move(in.meta), static_cast<uint32_t>(outputs.size()));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined()) continue;
    // Detached from the first run's graph, which dies with the last handle to it: its activations go.
    outputs[i] =
        outputs[i].requires_grad() ? node_output(outputs[i], node, static_cast<uint32_t>(i)) : outputs[i].detach();
  }
  return outputs;
}

}  // namespace cpf::autograd
