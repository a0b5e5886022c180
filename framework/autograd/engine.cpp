#include "framework/autograd/engine.h"

#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "framework/autograd/grad_mode.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/profile.h"

namespace cpf {
namespace {

// The device of a node's incoming gradients (the CPU when none is defined): where its backward runs,
// for the profiler's GPU timer.
Device grads_device(const std::vector<Tensor>& grads) {
  for (const Tensor& g : grads) {
    if (g.defined()) return g.device();
  }
  return Device::cpu();
}

using autograd::Edge;
using autograd::Node;

// Pending gradient inputs of one node, summed as they arrive.
struct NodeTask {
  std::vector<Tensor> grads;
  int dependencies = 0;
};

// Takes the incoming handle: a gradient the engine alone holds can be adopted by a leaf (AccumulateGrad).
void accumulate(Tensor& slot, Tensor incoming) {
  if (!incoming.defined()) return;
  slot = slot.defined() ? raw::add(slot, incoming) : std::move(incoming);
}

// Counts, for every node reachable from the roots, how many edges point into it (iterative DFS).
std::unordered_map<Node*, NodeTask> collect_dependencies(const std::vector<Edge>& root_edges) {
  std::unordered_map<Node*, NodeTask> tasks;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Edge& e : root_edges) {
    if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    tasks[node].grads.resize(node->num_outputs());
    for (const Edge& next : node->next_edges()) {
      if (!next.node) continue;
      tasks[next.node.get()].dependencies += 1;
      if (seen.insert(next.node.get()).second) stack.push_back(next.node.get());
    }
  }
  return tasks;
}

// A leaf's gradient sink: no outgoing edges, so running it early changes nothing downstream.
bool is_leaf_accumulator(const Node& node) { return dynamic_cast<const autograd::AccumulateGrad*>(&node) != nullptr; }

void check_gradient(const Node& node, size_t input, const Tensor& grad) {
  const auto& meta = node.input_meta()[input];
  CPF_CHECK(grad.shape() == meta.shape, "autograd: backward of '", node.name(), "' returned a gradient of shape ",
            grad.shape(), " for input ", input, " of shape ", meta.shape);
  CPF_CHECK(grad.dtype() == meta.dtype, "autograd: backward of '", node.name(), "' returned a ", grad.dtype(),
            " gradient for input ", input, " of dtype ", meta.dtype);
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  CPF_CHECK(grads.empty() || grads.size() == roots.size(), "backward: ", grads.size(), " gradients given for ",
            roots.size(), " roots");
  std::vector<Edge> root_edges;
  std::vector<Tensor> root_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    CPF_CHECK(root.defined(), "backward: root ", i, " is an undefined tensor");
    CPF_CHECK(root.requires_grad(), "backward: the tensor of shape ", root.shape(),
              " does not require grad (no input of its computation requires grad, or it was computed under "
              "NoGradGuard)");
    Tensor seed = grads.empty() ? Tensor() : grads[i];
    if (!seed.defined()) {
      CPF_CHECK(root.numel() == 1, "backward: a gradient can only be implied for a scalar output; the root has shape ",
                root.shape(), ", pass grad explicitly");
      seed = ones_like(root.detach());
    }
    CPF_CHECK(seed.shape() == root.shape(), "backward: gradient of shape ", seed.shape(), " for a root of shape ",
              root.shape());
    CPF_CHECK(seed.dtype() == root.dtype(), "backward: gradient dtype ", seed.dtype(), " differs from root dtype ",
              root.dtype());
    root_edges.push_back(autograd::gradient_edge(root));
    root_grads.push_back(seed);
  }

  NoGradGuard no_grad;
  auto tasks = collect_dependencies(root_edges);
  for (size_t i = 0; i < root_edges.size(); ++i) {
    accumulate(tasks[root_edges[i].node.get()].grads[root_edges[i].input_nr], root_grads[i]);
  }
  // Ready nodes, newest first (sequence number), which keeps memory low on long chains.
  auto newer = [](Node* a, Node* b) { return a->sequence_nr() < b->sequence_nr(); };
  std::priority_queue<Node*, std::vector<Node*>, decltype(newer)> ready(newer);
  std::unordered_set<Node*> queued;
  for (const Edge& e : root_edges) {
    if (tasks[e.node.get()].dependencies == 0 && queued.insert(e.node.get()).second) ready.push(e.node.get());
  }
  // Keep nodes alive while running even if the last tensor owning them goes away.
  std::vector<std::shared_ptr<Node>> keep_alive;
  for (const Edge& e : root_edges) keep_alive.push_back(e.node);

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    NodeTask& task = tasks[node];
    std::vector<Tensor> input_grads;
    {
      std::optional<profile::Scope> scope;
      if (profile::enabled()) scope.emplace("backward/" + node->name(), grads_device(task.grads));
      input_grads = node->apply(task.grads);
    }
    task.grads.clear();
    const auto& edges = node->next_edges();
    CPF_CHECK(input_grads.size() == edges.size() || edges.empty(), "autograd: backward of '", node->name(),
              "' returned ", input_grads.size(), " gradients for ", edges.size(), " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& next = edges[i];
      if (!next.node) continue;
      if (input_grads[i].defined()) check_gradient(*node, i, input_grads[i]);
      NodeTask& next_task = tasks[next.node.get()];
      accumulate(next_task.grads[next.input_nr], std::move(input_grads[i]));
      if (--next_task.dependencies == 0) {
        keep_alive.push_back(next.node);
        if (is_leaf_accumulator(*next.node)) {
          // At once: its gradient is final now, and its ready hooks (a data-parallel bucket
          // all-reduce) should start before the rest of backward, whatever its sequence number.
          next.node->apply(next_task.grads);
          next_task.grads.clear();
        } else {
          ready.push(next.node.get());
        }
      }
    }
    if (!retain_graph) node->release();
  }
}

void backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad}, retain_graph);
}

}  // namespace cpf
