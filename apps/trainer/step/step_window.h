#pragma once
// The steps a single-rank run has enqueued but not yet read back (docs/training.md, "Host synchronisation
// in a step"). Each step's gradient sum of squares and loss are copied, device to device, into its slot
// of one (kCapacity, 2) f64 buffer on the model's device; read() copies the filled slots to the host at
// once (one copy, the only wait) and turns them into the steps' results in order. The trainer reads back
// only when it must: at a logging step, before an evaluation, a checkpoint, the last step or a stop, and
// when the window is full.
#include <cstdint>
#include <vector>

#include "apps/trainer/step/training_step.h"

namespace cpf::trainer {

class StepWindow {
 public:
  static constexpr int64_t kCapacity = 32;  // steps in flight at most

  explicit StepWindow(Device device);

  // Slot size() takes this step's values: sum_squares (1) f64 and loss () floating, both on the window's
  // device; `tokens` is known on the host. Throws when the window is full or a value does not fit.
  void add(const Tensor& sum_squares, const Tensor& loss, int64_t tokens);
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  bool empty() const { return tokens_.empty(); }
  bool full() const { return size() == kCapacity; }

  // The results of the steps added since the last read, oldest first: loss and grad norm as a per-step
  // read-back gives them (sqrt of the sum; skipped when that is not finite). Device errors of those
  // steps are reported here. The window is empty afterwards, whether or not this throws.
  std::vector<StepResult> read();

 private:
  Tensor buffer_;  // (kCapacity, 2) f64: sum of squares, loss per slot
  std::vector<int64_t> tokens_;
};

}  // namespace cpf::trainer
