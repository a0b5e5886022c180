#pragma once
// The autograd graph. A differentiable op that sees an input requiring grad records one Node:
// edges to the nodes that produced its inputs (or to AccumulateGrad for leaves), the tensors it
// saved (with their version, so later in-place writes are caught) and a backward function that maps
// output gradients to input gradients. The engine (engine.h) walks these nodes iteratively.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: the input does not need a gradient
  uint32_t input_nr = 0;       // which output of `node` the gradient flows into
};

// Shape/dtype of one forward input: gradients are checked against it.
struct InputMeta {
  Shape shape;
  DType dtype = DType::f32;
};

class Node {
 public:
  // Iterative: a long chain (each node owning the previous one through its edges) would otherwise be
  // destroyed recursively and overflow the stack.
  virtual ~Node();
  virtual std::string name() const = 0;
  // grad_outputs[i] is the gradient of output i (undefined when nothing flowed into it).
  // Returns one gradient per next edge (undefined where the input gets none).
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) = 0;
  // Drops saved tensors after a backward without retain_graph.
  virtual void release() { released_ = true; }
  bool released() const { return released_; }

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  const std::vector<InputMeta>& input_meta() const { return input_meta_; }
  uint32_t num_outputs() const { return num_outputs_; }
  uint64_t sequence_nr() const { return sequence_nr_; }

 protected:
  Node(std::vector<Edge> next_edges, std::vector<InputMeta> input_meta, uint32_t num_outputs);

 private:
  std::vector<Edge> next_edges_;
  std::vector<InputMeta> input_meta_;
  uint32_t num_outputs_;
  uint64_t sequence_nr_;
  bool released_ = false;
};

// Sink for a leaf tensor's gradient: tensor.grad += incoming (always accumulates).
//
// The engine runs it once per backward, as soon as every node feeding the leaf has run (its
// incoming gradient is then the sum of all contributions), and then calls its gradient-ready hooks
// (grad_ready_hook.h) in registration order. A node with hooks is kept alive by their handles, so
// the same node serves every forward while a hook is registered.
class AccumulateGrad final : public Node {
 public:
  using Hook = std::function<void(const Tensor& leaf)>;

  explicit AccumulateGrad(Tensor leaf);
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
  void release() override {}  // leaves stay usable across backward calls
  const Tensor& leaf() const { return leaf_; }

  // Returns an id for remove_hook. Not synchronised with a backward running on another thread.
  uint64_t add_hook(Hook hook);
  void remove_hook(uint64_t id);

 private:
  Tensor leaf_;
  std::vector<std::pair<uint64_t, Hook>> hooks_;
  uint64_t next_hook_id_ = 1;
};

// A tensor kept for backward: a detached alias (no reference cycle through grad_fn) plus the
// storage version at save time. unpack() throws when the data changed in between.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  const Tensor& unpack() const;
  bool defined() const { return data_.defined(); }

 private:
  Tensor data_;
  uint64_t version_ = 0;
};

using GradList = std::vector<Tensor>;
using BackwardFn = std::function<GradList(const GradList& grad_outputs)>;

// A node whose backward is a lambda (captures SavedTensors by value). release() destroys the lambda.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn backward, std::vector<Edge> next_edges, std::vector<InputMeta> meta,
               uint32_t num_outputs);
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
  void release() override;

 private:
  std::string name_;
  BackwardFn backward_;
};

// The edge through which a gradient for `t` flows (its grad_fn, or its leaf accumulator); a null
// edge when t does not require grad.
Edge gradient_edge(const Tensor& t);

// What a node records of its forward inputs: one edge per input (null where it needs no gradient) and its
// shape and dtype (undefined inputs give empty metadata).
struct NodeInputs {
  std::vector<Edge> edges;
  std::vector<InputMeta> meta;
};
NodeInputs node_inputs(const std::vector<Tensor>& inputs);

// A fresh impl of `t` (its data shared) that requires grad as output `output_nr` of `node`. Fresh, so the
// tensor an op returned (possibly one of its inputs, or a tensor of another graph) is not changed.
Tensor node_output(const Tensor& t, const std::shared_ptr<Node>& node, uint32_t output_nr);

// True when recording is on and some input requires grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Records `backward` for `outputs` computed from `inputs`, when any_requires_grad(inputs). Outputs
// become non-leaves that require grad. Returns the outputs for chaining.
std::vector<Tensor> record(const std::string& name, std::vector<Tensor> outputs, const std::vector<Tensor>& inputs,
                           BackwardFn backward);
Tensor record(const std::string& name, Tensor output, const std::vector<Tensor>& inputs, BackwardFn backward);

// Records `backward` as the origin of `output`'s gradient for an op with no local differentiable
// input (dist::recv: the gradient goes back over the wire). `output` (a fresh tensor the caller owns)
// becomes a non-leaf that requires grad; `backward` receives its gradient and returns no gradients.
// The caller decides whether to record (grad mode, floating dtype).
Tensor record_source(const std::string& name, Tensor output, BackwardFn backward);

// The op name of the node the engine is running on this thread ("" outside backward).
const std::string& current_backward_op();

}  // namespace cpf::autograd
