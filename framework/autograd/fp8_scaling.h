#pragma once
// The scaling recipes of FP8 training (docs/fp8.md, "Scaling recipes"):
//
//   current   each tensor's scale from its own amax, computed right before its cast (an extra read of
//             the tensor, nothing carried between steps; torchao's "dynamic", TransformerEngine's
//             current scaling)
//   delayed   each tensor's scale from the amaxes of earlier steps (a history of amax_history steps,
//             its max or its newest entry), the amax of this step recorded by the cast itself; all
//             scales move on together after the optimizer step (TransformerEngine's DelayedScaling)
//
// Fp8ScalingState holds the delayed recipe's state of one model: a slot per FP8 GEMM call site, keyed
// by a stable name ("blocks.3.fp8_1": the second FP8 linear of block 3), each with the scale, the
// recorded amax and the amax history of its input, its weight and its output gradient. The values
// live in a few device buffers (64 slots each) and slots are views into them, so a CUDA graph captured
// after the first step reads and writes the same addresses every replay, the ranks can all-reduce the
// amaxes in one collective per buffer, and one kernel updates every scale (fp8_scale_update.h).
//
//   step 1   a slot is new: its casts use current scaling, record their amax and leave their scale in
//            the slot (what the next step uses should no amax reach the history: a skipped step)
//   update   histories roll, scales follow (skipped, amaxes dropped, when the step was skipped)
//   step 2+  casts use the slot's scale and record their amax
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "framework/tensor/ops/fp8_scale_update.h"
#include "framework/tensor/tensor.h"

namespace cpf {

enum class Fp8Recipe { current, delayed };

struct Fp8ScalingOptions {
  Fp8Recipe recipe = Fp8Recipe::current;
  int64_t margin = 0;                                     // scales are fp8_max / amax / 2^margin
  int64_t amax_history = 16;                              // delayed: steps of amax kept per tensor
  raw::AmaxCompute amax_compute = raw::AmaxCompute::max;  // delayed: the history's max, or its newest
  // The weights' FP8 copies made once per training step and reused by its later calls (recomputed blocks,
  // micro-batches; fp8_weight_cache.h); false casts them at every call.
  bool cache_weights = true;
  // The first and the last transformer blocks whose linears stay bf16 (Megatron-Core's
  // num_layers_at_start_in_bf16 / _at_end_): the blocks nearest the embedding and the head are the most
  // sensitive to quantisation.
  int64_t bf16_first_blocks = 0;
  int64_t bf16_last_blocks = 0;
  // The forward GEMMs with cuBLASLt's FP8 fast accumulation (raw::fp8_matmul_nt; TransformerEngine's default
  // for the forward); the backward's always promote their partial sums.
  bool fast_forward_accumulation = false;
  // The FP8 casts of the MLP output projection's input done by its activation (GELU, SwiGLU): one pass over
  // the activation's input, h never written in bf16 (fp8_linear_after). false: the activation writes h and
  // the linear casts it (the same values). On since its GPU kernels ran and measured faster (docs/fp8.md).
  bool fuse_activation_casts = true;
};

// Whether block `index` of `num_layers` runs its linears in FP8 under `options` (outside the bf16 ones).
inline bool fp8_block(const Fp8ScalingOptions& options, int64_t index, int64_t num_layers) {
  return index >= options.bf16_first_blocks && index < num_layers - options.bf16_last_blocks;
}

// Throws naming the field when an option is out of range (margin in [0, 64], amax_history in [1, 4096],
// bf16_first_blocks and bf16_last_blocks >= 0).
void validate(const Fp8ScalingOptions& options);

// The three tensors of an FP8 GEMM call site.
enum class Fp8Role { input = 0, weight = 1, grad_output = 2 };

// One call site's delayed-scaling state: () f32 views into Fp8ScalingState's buffers.
struct Fp8Slot {
  std::array<Tensor, 3> scale;  // by Fp8Role: the scale its casts use
  std::array<Tensor, 3> amax;   // by Fp8Role: max |x| over this step's casts, folded in by the casts
  bool fresh = true;            // no amax history yet: cast with current scaling (and record the amax)
};

class Fp8ScalingState {
 public:
  Fp8ScalingState(Fp8ScalingOptions options, Device device);

  const Fp8ScalingOptions& options() const { return options_; }
  Device device() const { return device_; }

  // The slot of `key`, made (fresh) on first use. The same key always gives views of the same values.
  Fp8Slot slot(const std::string& key);
  // The keys, in the order their slots were made.
  const std::vector<std::string>& keys() const { return keys_; }

  // The recorded amaxes, one (3 * slots) f32 buffer per 64 slots: what DP/CP ranks all-reduce (max)
  // before update so that every rank derives the same scales.
  std::vector<Tensor> amax_buffers() const;
  // FNV-1a over the keys in order, in 52 bits (exact through an f64 all-reduce): ranks that made other
  // call sites, or in another order, would reduce unrelated amaxes. The trainer compares it across ranks
  // whenever slots were added since the count it last agreed on (agreed_slots).
  double keys_fingerprint() const;
  int64_t agreed_slots() const { return agreed_slots_; }
  void set_agreed_slots(int64_t slots) { agreed_slots_ = slots; }

  // After the optimizer step: rolls every history, derives every scale and clears the amaxes (one
  // kernel per buffer); a non-finite skip_if_nonfinite (the step's gradient sum of squares) drops the
  // step's amaxes instead. Slots made before the call are no longer fresh.
  void update(const Tensor& skip_if_nonfinite = Tensor());
  // The clipped casts counted by the updates since the last call, then zero: per step, every (slot, role)
  // whose amax outgrew the delayed scale it was cast with (fp8_scale_update.h). One read-back: the
  // trainer calls it at its logging steps. Every rank counts the same (the amaxes are reduced first).
  int64_t take_clipped();

  // The state as exact text (every float as its bits, each slot settled or fresh), for a checkpoint's
  // metadata; restore() takes it back into an empty state, making the slots it names. A history of another
  // length keeps its newest entries (padded with zeros, which the max ignores). restore refuses a text it
  // cannot take whole (bad bits, a non-finite or negative value, missing or extra values, a repeated key)
  // and then leaves the state empty.
  std::string serialize() const;
  void restore(const std::string& text);

 private:
  struct Buffer {
    Tensor history;  // (3 * kSlots, amax_history) f32, newest first
    Tensor amax;     // (3 * kSlots) f32
    Tensor scale;    // (3 * kSlots) f32
    Tensor fp8_max;  // (3 * kSlots) f32: 448 for inputs and weights (E4M3), 57344 for gradients (E5M2)
  };
  static constexpr int64_t kSlots = 64;

  void add_buffer();
  Fp8Slot view_of(int64_t index) const;

  Fp8ScalingOptions options_;
  Device device_;
  std::vector<Buffer> buffers_;
  Tensor clipped_;  // () f32 on device_: clipped entries counted by update since take_clipped
  std::vector<std::string> keys_;
  std::map<std::string, int64_t> index_;
  int64_t settled_ = 0;  // slots [0, settled_) have been through an update (or a restore)
  int64_t agreed_slots_ = 0;
};

}  // namespace cpf
