#pragma once
// Per-step copies of a model's f32 master parameters in the compute dtype (bf16 mixed precision).
//
//   nn::ComputeCopies copies;                       // owned by the model (models/gpt.cpp)
//   copies.refresh(model.parameters(), DType::bf16);  // at the start of each forward: one multi-tensor cast
//   nn::ComputeCopiesScope scope(&copies);          // Linear and compute_parameter now use the copies
//
// Which parameters get copies is learned: a lookup that finds no copy marks its parameter as wanted (the
// caller then casts it itself, as without a cache), and later refreshes keep every wanted parameter's copy.
// So the first step casts per use; every later one converts exactly the parameters the forward reads in
// the compute dtype (not the f32 norms or an untied embedding table) in one raw::to_many call (one launch
// per 64 tensors on a device). A copy is valid while its parameter's storage version is the one it was
// made from: the optimizer's in-place update (or a checkpoint load, or Module::to) bumps the version, so a
// refresh converts exactly the wanted parameters that changed, and a stale copy is never used. Copies are new tensors
// at every refresh, never written in place, so a graph that saved one (the linear op keeps its bf16 weight for dX)
// stays correct.
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "framework/autograd/functions/linear_cat.h"
#include "framework/tensor/tensor.h"

namespace cpf::nn {

class ComputeCopies {
 public:
  // Converts every wanted parameter of `params` whose dtype is not `dtype` and whose copy is missing or
  // stale; drops copies of tensors no longer listed. `dtype` must be floating.
  void refresh(const std::vector<Tensor>& params, DType dtype);
  // The up-to-date copy of `param` in `dtype`, or undefined (none made, stale, or another dtype); a miss
  // marks `param` as wanted by the next refresh.
  Tensor find(const Tensor& param, DType dtype) const;
  // The concatenation along dim 0 of `params`' up-to-date copies in `dtype`: linear_cat's weight for a
  // few rows (a decoding step), one GEMM for q, k and v without concatenating their weights per call.
  // Made by the first lookup that finds every part's copy, then kept, as a new tensor, until a part
  // changes (refresh drops it then); undefined while any part has no up-to-date copy.
  Tensor find_stacked(const std::vector<Tensor>& params, DType dtype) const;
  // Conversions done by the refreshes so far (tensors, not launches): what a test can count.
  int64_t conversions() const;
  // Concatenations made by find_stacked so far.
  int64_t stackings() const;

 private:
  struct Entry {
    Tensor param;  // holds the parameter, so its address is not reused while the entry lives
    uint64_t version = 0;
    Tensor copy;
  };
  struct Stacked {
    std::vector<Tensor> params;  // held, as Entry::param
    std::vector<uint64_t> versions;
    Tensor copy;
  };
  bool stacked_valid(const Stacked& s) const;

  mutable std::mutex mutex_;                        // forwards of one model on several threads share the copies
  std::unordered_map<const void*, Entry> entries_;  // keyed by the parameter's data address
  mutable std::unordered_set<const void*> wanted_;  // data addresses looked up without a valid copy
  mutable std::map<std::vector<const void*>, Stacked> stacked_;  // keyed by the parts' data addresses
  int64_t conversions_ = 0;
  mutable int64_t stackings_ = 0;
};

// While alive, Linear and compute_parameter (precision.h) on this thread take their compute-dtype
// parameters from `copies` when it holds an up-to-date one. Nests; restores the previous scope.
class ComputeCopiesScope {
 public:
  explicit ComputeCopiesScope(const ComputeCopies* copies);
  ~ComputeCopiesScope();
  ComputeCopiesScope(const ComputeCopiesScope&) = delete;
  ComputeCopiesScope& operator=(const ComputeCopiesScope&) = delete;

 private:
  const ComputeCopies* previous_;
};

// The active scope's up-to-date copy of `param` in `dtype`, or undefined (no scope, or none held).
Tensor active_compute_copy(const Tensor& param, DType dtype);

// linear_cat's kept concatenation of `parts`' compute copies (weights and biases, find_stacked) for an input
// x of fewer than kLinearCatMinFusedRows rows, without gradients (a decoding step, an evaluation), under an
// active scope; empty otherwise: a larger input builds its concatenation per call, which its GEMM dwarfs,
// and training keeps its memory and its few-row numerics (the parts' GEMMs apart) as they were.
LinearCatStacked active_stacked_copies(const Tensor& x, const std::vector<LinearWeights>& parts);

// The copies the active scope on this thread uses, or null: what code that re-runs a forward later (a
// recomputed block, framework/autograd/checkpoint.h) captures to use the same copies then.
const ComputeCopies* active_compute_copies();

}  // namespace cpf::nn
