#pragma once
// The FP8 copies of a model's weights, made once per training step (docs/fp8.md, "Weight copies").
//
// An FP8 linear needs its weight in E4M3 twice over (row-major for the forward GEMM, transposed for dX)
// with the scale it was cast with. Cast at every call, a step that runs a weight more than once pays the
// cast again: a recomputed block (model.recompute) runs each of its linears twice, and every micro-batch
// of run.grad_accum_steps runs them all. While a step scope is open, the first cast of a weight in the
// step is kept and every later call of the step takes it:
//
//   Fp8WeightCache cache;                             // owned by the model (models/gpt.h)
//   { Fp8WeightCache::StepScope step(&cache);         // the trainer, around a step's forwards and backwards
//     ... fp8_linear(x, w, b, {.weight_cache = &cache}) ...  // first call casts and keeps, later ones reuse
//   }                                                 // closed: every copy dropped before the optimizer step
//
// A copy is taken only while the scope that made it is open and its weights (one tensor, or linear_cat's
// parts) keep the shapes and storage versions they had, with the same scale source (current scaling, or the
// same delayed-scaling slot, fresh or settled) and margin; a call that must record the weight's amax
// (delayed scaling in training) takes only a copy whose cast recorded it into that call's slot. So the values are those
// of casting at every call, bit for bit. Each step starts empty, so a CUDA graph captured from a step holds the casts
// of its first uses, and a capture that fails leaves nothing behind once its scope closes. The copies cost 2 bytes a
// weight parameter while the step runs (the transposed one the backward keeps anyway); models whose parameters are
// sharded (ZeRO-3) cast at every call instead (their weights are whole only while their block runs).
//
// From the second step on the copies are made together: the first lookup of a step casts every weight the
// previous step used, in one launch per 48 row blocks (framework/tensor/ops/fp8_rows.h; current scaling adds
// one launch for all their amaxes), with the scales this step's calls will ask for (a delayed slot's scale,
// the slot now settled; or the weight's own amax), and linear_cat's parts cast where they lie rather than
// from a concatenation. The lookups then find them as they would find a call's cast: a call asking under
// other conditions (a slot still fresh) casts for itself, as before. The refresh runs inside the step, so a
// captured step holds it.
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "framework/autograd/fp8_scaling.h"
#include "framework/tensor/tensor.h"

namespace cpf {

struct Fp8LinearOptions;

// A weight in E4M3 with the inverse of the scale it was cast with.
struct Fp8WeightCopy {
  Tensor data;       // (N, K) fp8
  Tensor transpose;  // (K, N) fp8
  Tensor scale_inv;  // () f32
};

class Fp8WeightCache {
 public:
  // Opens the cache for one step (empty); closing drops every copy. Null: a scope that does nothing.
  class StepScope {
   public:
    explicit StepScope(Fp8WeightCache* cache);
    ~StepScope();
    StepScope(const StepScope&) = delete;
    StepScope& operator=(const StepScope&) = delete;

   private:
    Fp8WeightCache* cache_;
  };

  // The kept copy of the row-concatenation of `weights` for a call with `options`, or undefined data (no
  // open step, none kept, or kept under other conditions: see above). The step's first lookup refreshes.
  Fp8WeightCopy find(const std::vector<Tensor>& weights, const Fp8LinearOptions& options);
  // Keeps `copy`, cast for a call with `options`, when a step is open (else does nothing).
  void store(const std::vector<Tensor>& weights, const Fp8LinearOptions& options, Fp8WeightCopy copy);

  bool step_open() const;
  // Copies kept since construction (casts the cache made necessary once) and calls served from a copy:
  // what tests count.
  int64_t stored() const;
  int64_t reused() const;
  // Copies held now.
  int64_t size() const;
  // Copies made by the refreshes (counted in stored() too), and the weights the next refresh will cast.
  int64_t refreshed() const;
  int64_t planned() const;

 private:
  struct Entry {
    std::vector<Tensor> weights;  // held, so their addresses are not reused while the entry lives
    std::vector<uint64_t> versions;
    const void* scale_source = nullptr;  // the delayed slot's weight scale, or null (current scaling)
    bool fresh = false;                  // the slot's first step: cast by the weight's own amax
    int64_t margin = 0;
    const void* recorded_into = nullptr;  // the slot amax the cast folded the weight's into, or null
    Fp8WeightCopy copy;
    std::optional<Fp8Slot> slot;  // the delayed-scaling slot of the call that made it (what a refresh casts with)
    bool used = false;            // taken or made by a call this step: planned for the next refresh
  };
  // A weight the previous step used, as the refresh casts it.
  struct Planned {
    std::vector<Tensor> weights;
    std::optional<Fp8Slot> slot;
    int64_t margin = 0;
  };
  void open();
  void close();
  void refresh_locked(Device device);  // casts plan_'s weights on `device` into entries_ (mutex_ held)

  mutable std::mutex mutex_;  // forwards of one model on several threads share it
  bool open_ = false;
  std::map<std::vector<const void*>, Entry> entries_;  // keyed by the weights' data addresses
  int64_t stored_ = 0;
  int64_t reused_ = 0;
  std::vector<Planned> plan_;  // the weights used by the last step that used any
  bool refreshed_ = false;     // this step's refresh has run
  int64_t refreshed_count_ = 0;
};

}  // namespace cpf
