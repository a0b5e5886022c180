#pragma once
// Small device values read back without draining the device. The copies into pinned host memory and an
// event are queued on the device's current stream; the host later waits for that event only, so the work
// queued after enqueue() (a training step's clipping and optimizer kernels) keeps the GPU busy while the
// host goes on. The training step reads its gradient norm and loss this way (docs/training.md, "Host
// synchronisation in a step"). No CUDA header is included.
//
//   cuda::HostReadback readback(0);
//   readback.enqueue({sum_squares, loss});          // returns at once
//   ... queue more work on the same stream ...
//   const std::vector<double> v = readback.wait();  // waits for the two copies, not for that work
#include <cstddef>
#include <memory>
#include <vector>

#include "framework/tensor/tensor.h"

namespace cpf::cuda {

class HostReadback {
 public:
  static constexpr size_t kMaxValues = 8;

  // Nothing is allocated before the first enqueue (pinned memory and one event, then reused).
  explicit HostReadback(int device = 0);
  ~HostReadback();
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;

  // Queues, on the device's current stream, a copy of each tensor's one element (f32, f64 or bf16, on
  // this readback's device) into pinned memory, then records the event. Throws before queuing anything
  // for a wrong tensor, more than kMaxValues values, or while the previous enqueue has not been waited for.
  void enqueue(const std::vector<Tensor>& values);
  // Blocks until the copies of the last enqueue are done (counted as a stream synchronisation: the host
  // waits for an event while the device may still run later work), reports a device-side index error
  // found meanwhile, and returns the values as item<double>() reads them. Throws without a pending enqueue.
  std::vector<double> wait();
  bool pending() const;
  int device() const { return device_; }

 private:
  struct State;
  int device_ = 0;
  std::unique_ptr<State> state_;
};

}  // namespace cpf::cuda
