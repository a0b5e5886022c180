#pragma once
// Activation recomputation (gradient checkpointing) of one region of the forward, a transformer block
// say: the region's intermediate activations are not kept between the forward and the backward; the
// backward runs the region's forward again and backpropagates through that fresh graph.
//
//   forward   outputs = fn(inputs) with recording on, then the region's graph is dropped (its saved
//             activations are freed) and one node "recompute[name]" takes its place: it saves the
//             inputs only (plus, under `selective`, what forward_stash.h keeps).
//   backward  the node re-runs fn on detached copies of the saved inputs with recording on, calls
//             backward() on the recomputed outputs with the incoming gradients (a nested engine run:
//             the region's parameters receive their gradients and fire their gradient-ready hooks
//             there), and hands the inputs' gradients on.
//
// Policies: `full` recomputes everything; `selective` keeps the outputs of the GEMMs and of attention
// from the first run (forward_stash.h) and recomputes only norms, RoPE, activations and casts, which
// costs element-wise passes instead of matrix products and never re-runs attention (nor, under context
// parallelism, its ring of messages).
//
// The first forward runs exactly the ops the recompute runs, with recording on in both, so the values
// are identical bit for bit where the ops are deterministic, and so are losses and gradients against the
// same model without recomputation.
//
// Requirements the caller meets (checked where they can be):
//   - fn is deterministic (no random draws: the GPT blocks have no dropout) and reads no state that
//     changes between the forward and the backward: every parameter it uses is listed in `params`,
//     and a parameter written in place in between (an optimizer step before the backward) is an error.
//   - a parameter is used inside the region only (its gradient must be complete when the nested
//     backward ends, when its hooks fire); tied weights used outside stay outside the region.
#include <functional>
#include <string>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::autograd {

enum class RecomputePolicy { full, selective };

// The region: inputs -> outputs. Undefined inputs stay undefined; outputs may be undefined.
using RegionFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

struct CheckpointOptions {
  std::string name;                                // names the node: "recompute[<name>]"
  RecomputePolicy policy = RecomputePolicy::full;  // what the first forward keeps
  std::vector<Tensor> params;                      // every parameter fn reads (version-checked)
  // Called before the recompute (ahead of the version check) and after its nested backward: what makes
  // sharded parameters whole for that time (nn::ParameterUnits). Either may be empty.
  std::function<void()> before_recompute, after_recompute;
};

// fn(inputs) whose backward recomputes the region (see above). With recording off (evaluation) it is
// fn(inputs) and keeps nothing. Nested regions are allowed: an inner region runs as in a plain forward.
std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs, const CheckpointOptions& options);

}  // namespace cpf::autograd
