#pragma once
// What a selectively recomputed region keeps from its first forward (checkpoint.h,
// RecomputePolicy::selective): the outputs of the ops that are costly to run again, in call order.
//
//   first forward   (phase keep)    op computes its outputs, stash.keep(op, outputs)
//   recompute       (phase replay)  op takes stash.take(op) instead of computing them, and records its
//                                   backward node on the recomputed inputs as usual
//
// The ops that consult the stash are the GEMM groups (framework/autograd/functions/linear*.cpp) and
// attention (dot_product_attention and the context-parallel strategies): everything linear in cost and
// cheap to redo (norms, RoPE, activations, casts) is recomputed, the matrix products and the attention
// (quadratic in the sequence and, under context parallelism, a ring of messages) are not.
//
// The replay must meet the same ops in the same order: take() checks the op name and that the kept
// tensors were not changed in place since, so a region whose forward is not deterministic in its
// control flow fails loudly instead of pairing the wrong values.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::autograd {

class ForwardStash {
 public:
  enum class Phase { keep, replay };

  Phase phase() const { return phase_; }
  bool replaying() const { return phase_ == Phase::replay; }
  // Phase keep: appends `values` (kept alive until taken) under `op`.
  void keep(const std::string& op, const std::vector<Tensor>& values);
  // Phase replay: the next entry's values (released from the stash), after checking that it was kept
  // by `op` and that no value changed since.
  std::vector<Tensor> take(const std::string& op);
  // Switches to replay from the first entry; the entries must have been kept in this stash.
  void start_replay();
  // Throws unless every kept entry was taken (a recompute that skipped an op).
  void check_consumed(const std::string& region) const;
  // Bytes of the entries not yet taken (what the stash holds on the device or host).
  size_t bytes() const;

 private:
  struct Entry {
    std::string op;
    std::vector<Tensor> values;
    std::vector<uint64_t> versions;
  };
  Phase phase_ = Phase::keep;
  std::vector<Entry> entries_;
  size_t next_ = 0;
};

// The stash of the selectively recomputed region running on this thread, or null.
ForwardStash* active_forward_stash();

// Makes `stash` (or none, null) the active one while alive; restores the previous one.
class ForwardStashScope {
 public:
  explicit ForwardStashScope(ForwardStash* stash);
  ~ForwardStashScope();
  ForwardStashScope(const ForwardStashScope&) = delete;
  ForwardStashScope& operator=(const ForwardStashScope&) = delete;

 private:
  ForwardStash* previous_;
};

// `compute()` (a std::vector<Tensor>) outside a selective region; inside one, kept on the first
// forward and taken instead of computed on the recompute. The one call an op needs.
template <class Compute>
std::vector<Tensor> stashed(const std::string& op, Compute&& compute) {
  ForwardStash* stash = active_forward_stash();
  if (stash == nullptr) return std::forward<Compute>(compute)();
  if (stash->replaying()) return stash->take(op);
  std::vector<Tensor> values = std::forward<Compute>(compute)();
  stash->keep(op, values);
  return values;
}

}  // namespace cpf::autograd
