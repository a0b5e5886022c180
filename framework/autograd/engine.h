#pragma once
// The backward engine: reverse-mode differentiation over the recorded graph.
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf {

// Accumulates d(roots)/d(leaf) into leaf.grad() for every leaf that requires grad. `grads` are the
// seeds (one per root; omit for scalar roots, which are seeded with 1). The graph's saved tensors
// are freed afterwards unless retain_graph. Runs with recording disabled. Iterative: deep graphs
// do not grow the call stack.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false);
void backward(const Tensor& root, const Tensor& grad = Tensor(), bool retain_graph = false);

}  // namespace cpf
