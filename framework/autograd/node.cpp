#include "framework/autograd/node.h"

#include <atomic>
#include <memory>
#include <type_traits>

#include "framework/autograd/grad_mode.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"

namespace cpf {

namespace {
thread_local bool t_grad_enabled = true;
}  // namespace

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

namespace autograd {
namespace {

std::atomic<uint64_t> g_next_sequence_nr{0};
thread_local std::string t_current_op;

}  // namespace

const std::string& current_backward_op() { return t_current_op; }

// Set by the engine around Node::apply so SavedTensor errors can name the op.
struct CurrentOpScope {
  explicit CurrentOpScope(const std::string& name) : previous(t_current_op) { t_current_op = name; }
  ~CurrentOpScope() { t_current_op = previous; }
  std::string previous;
};

Node::Node(std::vector<Edge> next_edges, std::vector<InputMeta> input_meta, uint32_t num_outputs)
    : next_edges_(std::move(next_edges)),
      input_meta_(std::move(input_meta)),
      num_outputs_(num_outputs),
      sequence_nr_(g_next_sequence_nr.fetch_add(1)) {}

Node::~Node() {
  std::vector<std::shared_ptr<Node>> pending;
  auto adopt_edges = [&pending](std::vector<Edge>& edges) {
    for (Edge& e : edges) {
      if (e.node) pending.push_back(std::move(e.node));
    }
    edges.clear();
  };
  adopt_edges(next_edges_);
  while (!pending.empty()) {
    std::shared_ptr<Node> node = std::move(pending.back());
    pending.pop_back();
    // Sole owner: the node dies at the end of this iteration. Take its edges first so its own
    // destructor has nothing left to recurse into.
    if (node.use_count() == 1) adopt_edges(node->next_edges_);
  }
}

namespace {

// The number of Tensor handles sharing t's TensorImpl. Tensor is standard-layout with the impl's
// shared_ptr as its only member, so the two are pointer-interconvertible (no change to tensor.h, which
// every file includes).
long handle_count(const Tensor& t) {
  static_assert(std::is_standard_layout_v<Tensor> && sizeof(Tensor) == sizeof(std::shared_ptr<TensorImpl>));
  return reinterpret_cast<const std::shared_ptr<TensorImpl>&>(t).use_count();
}

// True when `incoming` can become a leaf's gradient as it is: nothing else can see or change its data
// (one handle, the engine's; one impl on its storage: no view, saved alias or captured copy) and it
// covers exactly its own dense storage (not a broadcast view or a slice of a larger buffer).
bool adoptable(const Tensor& incoming) {
  return handle_count(incoming) == 1 && incoming.storage() && incoming.storage().use_count() == 1 &&
         !incoming.requires_grad() && incoming.is_contiguous() && incoming.offset() == 0 &&
         incoming.storage()->nbytes() == static_cast<size_t>(incoming.numel()) * dtype_size(incoming.dtype());
}

}  // namespace

AccumulateGrad::AccumulateGrad(Tensor leaf) : Node({}, {}, 1), leaf_(std::move(leaf)) {}

std::vector<Tensor> AccumulateGrad::apply(const std::vector<Tensor>& grad_outputs) {
  const Tensor& incoming = grad_outputs.at(0);
  if (incoming.defined()) {
    Tensor current = leaf_.grad();
    if (!current.defined()) {
      // Adopted when the engine holds the only reference (saves one copy per weight per step); otherwise a
      // private copy: the incoming gradient may alias another node's buffer or be a broadcast view.
      leaf_.set_grad(adoptable(incoming) ? incoming : raw::clone(incoming));
    } else {
      raw::add_(current, incoming);
    }
  }
  if (!hooks_.empty()) {
    // A copy: a hook may add or remove hooks of this leaf.
    const std::vector<std::pair<uint64_t, Hook>> hooks = hooks_;
    for (const auto& [id, hook] : hooks) hook(leaf_);
  }
  return {};
}

uint64_t AccumulateGrad::add_hook(Hook hook) {
  CPF_CHECK(hook != nullptr, "autograd: add_hook on the accumulator of a leaf of shape ", leaf_.shape(),
            ": the hook is empty");
  const uint64_t id = next_hook_id_++;
  hooks_.emplace_back(id, std::move(hook));
  return id;
}

void AccumulateGrad::remove_hook(uint64_t id) {
  std::erase_if(hooks_, [id](const auto& entry) { return entry.first == id; });
}

SavedTensor::SavedTensor(const Tensor& t) {
  if (t.defined()) {
    data_ = t.detach();
    version_ = t.version();
  }
}

const Tensor& SavedTensor::unpack() const {
  CPF_CHECK(!data_.defined() || data_.version() == version_, "autograd: a tensor of shape ", data_.shape(),
            " saved for the backward of '", current_backward_op(),
            "' was modified in place after it was saved (version ", data_.version(), ", saved at version ", version_,
            "); compute on a copy (clone) or make the change out of place");
  return data_;
}

FunctionNode::FunctionNode(std::string name, BackwardFn backward, std::vector<Edge> next_edges,
                           std::vector<InputMeta> meta, uint32_t num_outputs)
    : Node(std::move(next_edges), std::move(meta), num_outputs),
      name_(std::move(name)),
      backward_(std::move(backward)) {}

std::vector<Tensor> FunctionNode::apply(const std::vector<Tensor>& grad_outputs) {
  CPF_CHECK(!released(), "autograd: trying to backward through the graph of '", name_,
            "' a second time; its saved tensors were freed after the first backward (pass retain_graph=true to "
            "the first backward call if you need to run it again)");
  CurrentOpScope scope(name_);
  return backward_(grad_outputs);
}

void FunctionNode::release() {
  Node::release();
  backward_ = nullptr;  // frees the captured SavedTensors
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  TensorImpl* impl = t.impl();
  std::shared_ptr<Node> accumulator = impl->grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(t);
    impl->grad_accumulator = accumulator;
  }
  return {accumulator, 0};
}

NodeInputs node_inputs(const std::vector<Tensor>& inputs) {
  NodeInputs in;
  in.edges.reserve(inputs.size());
  in.meta.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    in.edges.push_back(gradient_edge(t));
    in.meta.push_back(t.defined() ? InputMeta{t.shape(), t.dtype()} : InputMeta{});
  }
  return in;
}

Tensor node_output(const Tensor& t, const std::shared_ptr<Node>& node, uint32_t output_nr) {
  Tensor out = t.detach();
  TensorImpl* impl = out.impl();
  impl->requires_grad = true;
  impl->grad_fn = node;
  impl->output_nr = output_nr;
  return out;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

std::vector<Tensor> record(const std::string& name, std::vector<Tensor> outputs, const std::vector<Tensor>& inputs,
                           BackwardFn backward) {
  if (!any_requires_grad(inputs)) return outputs;
  NodeInputs in = node_inputs(inputs);
  auto node = std::make_shared<FunctionNode>(name, std::move(backward), std::move(in.edges), std::move(in.meta),
                                             static_cast<uint32_t>(outputs.size()));
  for (size_t i = 0; i < outputs.size(); ++i) {
    // A raw op may return one of its inputs unchanged (contiguous, to): node_output leaves it as it is.
    if (outputs[i].defined() && is_floating(outputs[i].dtype())) {
      outputs[i] = node_output(outputs[i], node, static_cast<uint32_t>(i));
    }
  }
  return outputs;
}

Tensor record(const std::string& name, Tensor output, const std::vector<Tensor>& inputs, BackwardFn backward) {
  return record(name, std::vector<Tensor>{std::move(output)}, inputs, std::move(backward)).front();
}

Tensor record_source(const std::string& name, Tensor output, BackwardFn backward) {
  CPF_CHECK(output.defined() && is_floating(output.dtype()), "autograd::record_source(", name,
            "): the output must be a defined floating tensor, got ",
            output.defined() ? dtype_name(output.dtype()) : "an undefined tensor");
  auto node =
      std::make_shared<FunctionNode>(name, std::move(backward), std::vector<Edge>{}, std::vector<InputMeta>{}, 1);
  TensorImpl* impl = output.impl();
  impl->requires_grad = true;
  impl->grad_fn = std::move(node);
  impl->output_nr = 0;
  return output;
}

}  // namespace autograd
}  // namespace cpf
