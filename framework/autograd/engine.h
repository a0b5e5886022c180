#pragma once
// The backward engine: reverse-mode differentiation over the recorded graph.
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf {

// Accumulates d(roots)/d(leaf) into leaf.grad() for every leaf that requires grad. `grads` are the
// seeds (one per root; omit for scalar roots, which are seeded with 1). The graph's saved tensors
// are freed afterwards unless retain_graph. Runs with recording disabled. Iterative: deep graphs
// do not grow the call stack.
//
// A leaf's gradient is final once every node that feeds it has run; its accumulator runs right
// then (before other ready nodes), adds the sum of the contributions to leaf.grad() and fires the
// leaf's gradient-ready hooks (grad_ready_hook.h), once per backward call.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false);
void backward(const Tensor& root, const Tensor& grad = Tensor(), bool retain_graph = false);

}  // namespace cpf
