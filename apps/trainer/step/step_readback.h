#pragma once
// The training step's read-back of its gradient sum of squares and loss (docs/training.md, "Host
// synchronisation in a step"). On a GPU the two values are copied into pinned memory with an event
// recorded right after them, before the clipping and optimizer kernels are enqueued; wait() then blocks on
// that event only, so the host goes on (logs, the next step's data and first launches) while the GPU
// still runs the optimizer phase. Elsewhere (the CPU, values not on the step's device, a build without
// the CUDA backend) the values are read with item() at enqueue, as before.
#include <memory>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::trainer {

class StepReadback {
 public:
  // One per thread and device, reused by every step (its pinned memory and event are allocated once).
  static StepReadback& for_device(Device device);

  explicit StepReadback(Device device);
  ~StepReadback();
  StepReadback(const StepReadback&) = delete;
  StepReadback& operator=(const StepReadback&) = delete;

  // Starts reading `values` (1-element floating tensors). Returns without waiting on a GPU.
  void enqueue(const std::vector<Tensor>& values);
  // The values of the last enqueue, as item<double>() reads them; on a GPU waits for their copies only.
  std::vector<double> wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpf::trainer
